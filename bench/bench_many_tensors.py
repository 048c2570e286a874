"""A state of thousands of tensors: kaudit beside plain h5py and torch DCP.

A transformer-like training state (``--layers`` blocks of width ``--width``; 30 x 128 by
default): per parameter its weight (bfloat16 matrices, float32 biases and norms) and
AdamW's two float32 moments and int64 step counter, about 2,000 tensors and 62.5 MiB in
all, many of them small and a few large (the embedding). Each contender runs in a fresh
subprocess of its own, ``--rounds`` times in rotating order, so that memory and the page
cache do not leak from one into the next; each subprocess repeats each operation
``--repeat`` times after one warm-up:

- ``h5py``: the same datasets (what kaudit stores: bfloat16 as its bits) written by h5py
  into a fresh file and fsynced; read back, each dataset into a new array; and what a
  verification needs beside the hashing: one sha256 pass over the file's bytes plus the
  datasets' metadata (names, dtypes, shapes) through h5py;
- ``kaudit``: ``run.checkpoint(step, state)`` of a synchronous ``ka.Run`` (written,
  hashed, signed, tracked by DVC; no push) in a scratch repository, each checkpoint
  chained to the one before; ``run.restore()`` of a newly opened ``ka.Run`` (the opening
  not timed) from the newest; ``ka.verify`` of every checkpoint's manifest, as ``kaudit
  verify RUN`` does, per checkpoint (each its data and the link to its parent);
- ``dcp``: ``dcp.save`` of the same tensors (one process, DCP's ``FileSystemWriter`` with
  its fsync), and ``dcp.load`` into a template of them.

Before each timed read, the file(s) read are read through once, so every contender reads
from the page cache (kaudit and DCP write around it or not, each its own way).

Measured per operation: the wall time, the CPU seconds (user and system, every thread,
and the children waited for), the growth of the process's peak resident memory over its
size at the start of the operation (``VmHWM``, reset before each). Printed: the medians,
and the ratios judged against the targets, PASS or MISS:

- kaudit's checkpoint at most 1.3x h5py's write+fsync (wall);
- kaudit's restore at most 1.3x h5py's read (wall);
- kaudit's verify at most 1.5x one sha256 pass plus h5py's metadata read (wall);
- kaudit's whole cost (checkpoint + restore) at most 1.0x DCP's (save + load), in wall
  time and in CPU seconds; peak memory printed beside.

Run: .venv/bin/python bench/bench_many_tensors.py [--layers 30] [--width 128] [--rounds 2]
     .venv/bin/python bench/bench_many_tensors.py --quick   (a tiny state, every contender
       once, in this process: it checks the benchmark runs, its figures mean little)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Run as a script, only bench/ is on sys.path: the repository root makes bench a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._measure import cpu_seconds, peak, reset_peak

CONTENDERS = ("h5py", "kaudit", "dcp")
GOALS = (
    # (kaudit's, against whose, target)
    ("checkpoint", "h5py write+fsync", 1.3),
    ("restore", "h5py read", 1.3),
    ("verify", "sha256 + h5py metadata", 1.5),
)
DCP_TARGET = 1.0
READ_BLOCK = 16 * 2**20
_BUFFER = bytearray(READ_BLOCK)
"""The reads' buffer, allocated once: a fresh one would be counted in the baseline's
peak memory and time."""

Sample = dict[str, float]
"""One timed operation: ``wall``, ``cpu`` (seconds), ``mem`` (bytes of peak growth)."""


# -- the state ------------------------------------------------------------------------------


def make_state(layers: int, width: int) -> dict[str, Any]:
    """A transformer-like model and its AdamW state, as nested dicts of torch tensors."""
    import torch

    gen = torch.Generator().manual_seed(0)
    d, vocab = width, 32 * width
    shapes: dict[str, tuple[tuple[int, ...], Any]] = {"embed.weight": ((vocab, d), torch.bfloat16)}
    for i in range(layers):
        p = f"layers.{i}"
        for name in ("q", "k", "v", "o"):
            shapes[f"{p}.attn.{name}.weight"] = ((d, d), torch.bfloat16)
            shapes[f"{p}.attn.{name}.bias"] = ((d,), torch.float32)
        shapes[f"{p}.mlp.up.weight"] = ((4 * d, d), torch.bfloat16)
        shapes[f"{p}.mlp.up.bias"] = ((4 * d,), torch.float32)
        shapes[f"{p}.mlp.down.weight"] = ((d, 4 * d), torch.bfloat16)
        shapes[f"{p}.mlp.down.bias"] = ((d,), torch.float32)
        for norm in ("norm1", "norm2"):
            shapes[f"{p}.{norm}.weight"] = ((d,), torch.float32)
            shapes[f"{p}.{norm}.bias"] = ((d,), torch.float32)
    shapes["norm.weight"] = ((d,), torch.float32)
    shapes["norm.bias"] = ((d,), torch.float32)
    model = {n: torch.randn(s, generator=gen).to(t) for n, (s, t) in shapes.items()}
    optim = {
        n: {
            "step": torch.tensor(1000 + i, dtype=torch.int64),
            "exp_avg": torch.randn(s, generator=gen),
            "exp_avg_sq": torch.rand(s, generator=gen),
        }
        for i, (n, (s, _)) in enumerate(shapes.items())
    }
    return {"model": model, "optim": optim}


def tensors(state: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every tensor of the state with its path (``/model/embed.weight``)."""
    for key, value in state.items():
        path = f"{prefix}/{key}"
        if isinstance(value, dict):
            yield from tensors(value, path)
        else:
            yield path, value


def as_stored(tensor: Any) -> Any:
    """The numpy array kaudit stores for a tensor (a bfloat16's bits as uint16)."""
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.uint16).numpy()
    return tensor.numpy()


# -- measuring ------------------------------------------------------------------------------


def measure(fn: Callable[[], object]) -> Sample:
    """The wall time, CPU seconds and peak memory growth of one call of ``fn``."""
    rss = reset_peak()
    c0, t0 = cpu_seconds(), time.perf_counter()
    result = fn()
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    mem = peak() - rss
    del result
    return {"wall": wall, "cpu": cpu, "mem": float(mem)}


def read_through(*paths: Path) -> None:
    """Read every byte of these files (directories: their files) once: into the cache."""
    buf = _BUFFER
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            with open(file, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass


# -- the contenders -------------------------------------------------------------------------


def run_h5py(state: dict[str, Any], scratch: Path, repeat: int) -> dict[str, list[Sample]]:
    import h5py
    import numpy as np

    flat = [(path, as_stored(t)) for path, t in tensors(state)]

    def write(path: Path) -> None:
        with h5py.File(path, "w") as f:
            for name, array in flat:
                f.create_dataset(name, data=array)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(path: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        with h5py.File(path, "r") as f:

            def visit(name: str, obj: object) -> None:
                if isinstance(obj, h5py.Dataset):
                    array = np.empty(obj.shape, obj.dtype)
                    if array.size:
                        obj.read_direct(array)
                    out[name] = array

            f.visititems(visit)
        return out

    def sha_and_metadata(path: Path) -> None:
        h = hashlib.sha256()
        buf = _BUFFER
        view = memoryview(buf)
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
        h.hexdigest()
        meta = []

        def visit(name: str, obj: object) -> None:
            if isinstance(obj, h5py.Dataset):
                meta.append((name, obj.dtype, obj.shape))

        with h5py.File(path, "r") as f:
            f.visititems(visit)

    samples: dict[str, list[Sample]] = {"write": [], "read": [], "sha+meta": []}
    for n in range(repeat + 1):
        path = scratch / f"h5py-{n}.h5"
        written = measure(lambda: write(path))  # noqa: B023
        read_through(path)
        got = measure(lambda: read(path))  # noqa: B023
        verified = measure(lambda: sha_and_metadata(path))  # noqa: B023
        if n:
            samples["write"].append(written)
            samples["read"].append(got)
            samples["sha+meta"].append(verified)
        path.unlink()
    return samples


def run_kaudit(state: dict[str, Any], scratch: Path, repeat: int) -> dict[str, list[Sample]]:
    import kronos_audit as ka
    from bench._common import scratch_repo

    repo = scratch_repo()
    cwd = Path.cwd()
    os.chdir(repo)  # ka.verify verifies as content of the repository stood in
    try:
        samples = _kaudit_ops(ka, repo / "checkpoints", "bench", state, repeat)
        # The same bytes as four arrays: what the state costs per byte, so that the rest
        # is what it costs per tensor (the cost model).
        few = _kaudit_ops(ka, repo / "checkpoints", "few", as_few(state), repeat)
        samples.update({f"{op} (4 arrays)": got for op, got in few.items()})
    finally:
        os.chdir(cwd)
        shutil.rmtree(repo.parent, ignore_errors=True)
    return samples


def as_few(state: dict[str, Any]) -> dict[str, Any]:
    """The state's bytes as four float32 tensors of about a quarter each."""
    import torch

    nbytes = sum(t.nbytes for _, t in tensors(state))
    return {f"a{i}": torch.rand(nbytes // 16) for i in range(4)}


def _kaudit_ops(
    ka: Any, root: Path, run_id: str, state: dict[str, Any], repeat: int
) -> dict[str, list[Sample]]:
    samples: dict[str, list[Sample]] = {"checkpoint": [], "restore": [], "verify": []}
    run_dir = root / run_id

    def open_run() -> Any:
        return ka.Run(run_id, root=root, seed=1, every=ka.EverySteps(1), asynchronous=False)

    steps = range(1, repeat + 2)  # the first of each operation warms up
    with open_run() as run:  # one loop checkpointing: a chain of checkpoints
        for step in steps:
            took = measure(lambda: run.checkpoint(step, state))  # noqa: B023
            if step > 1:
                samples["checkpoint"].append(took)
    files = [run_dir / f"step-{step:08d}.h5" for step in steps]
    for n in steps:
        read_through(files[-1])
        with open_run() as run:
            restored = measure(run.restore)
            assert run.step == steps[-1], (run.step, steps[-1])
        if n > 1:
            samples["restore"].append(restored)
    # Each checkpoint as `kaudit verify RUN` verifies it: its data, and its link to its
    # parent, verified just before (the chain is not walked again).
    manifests = [Path(f"{h5}.kaudit.json") for h5 in files]
    for n in steps:
        read_through(*files)
        checked = measure(lambda: _verified(ka, manifests))
        if n > 1:
            count = len(manifests)
            samples["verify"].append(
                {**checked, "wall": checked["wall"] / count, "cpu": checked["cpu"] / count}
            )
    return samples


def _verified(ka: Any, manifests: list[Path]) -> None:
    results = ka.verify(manifests)
    assert len(results) == len(manifests)
    assert all(r.ok for r in results), [r.failures for r in results]


def run_dcp(state: dict[str, Any], scratch: Path, repeat: int) -> dict[str, list[Sample]]:
    import torch
    from torch.distributed.checkpoint.state_dict_loader import load
    from torch.distributed.checkpoint.state_dict_saver import save

    # One process and no process group: DCP says it assumes a single-process save.
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    template = {
        "model": {k: torch.empty_like(v) for k, v in state["model"].items()},
        "optim": {
            k: {n: torch.empty_like(t) for n, t in v.items()} for k, v in state["optim"].items()
        },
    }
    samples: dict[str, list[Sample]] = {"save": [], "load": []}
    for n in range(repeat + 1):
        directory = scratch / f"dcp-{n}"
        saved = measure(lambda: save(state, checkpoint_id=directory))  # noqa: B023
        read_through(directory)
        loaded = measure(lambda: load(template, checkpoint_id=directory))  # noqa: B023
        if n:
            samples["save"].append(saved)
            samples["load"].append(loaded)
        shutil.rmtree(directory)
    return samples


RUNNERS = {"h5py": run_h5py, "kaudit": run_kaudit, "dcp": run_dcp}


def _contender(name: str, layers: int, width: int, repeat: int, out: Path) -> None:
    scratch = Path(tempfile.mkdtemp(prefix=f"kaudit-bench-many-{name}-"))
    try:
        state = make_state(layers, width)
        samples = RUNNERS[name](state, scratch, repeat)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out.write_text(json.dumps(samples))


# -- the report -----------------------------------------------------------------------------


def _median(samples: list[Sample], what: str) -> float:
    return statistics.median(s[what] for s in samples)


def report(
    results: dict[str, dict[str, list[Sample]]], count: int, nbytes: int, runs: str
) -> dict[str, float]:
    print(f"state: {count:,} tensors, {nbytes / 2**20:.1f} MiB; {runs}")
    print(f"{'':28}{'wall':>10}{'cpu':>10}{'peak mem +':>12}")
    rows: dict[str, Sample] = {}
    for name in CONTENDERS:
        for op, samples in results[name].items():
            label = f"{name} {op}"
            rows[label] = {w: _median(samples, w) for w in ("wall", "cpu", "mem")}
            r = rows[label]
            print(
                f"{label:28}{r['wall'] * 1e3:>7.0f} ms{r['cpu'] * 1e3:>7.0f} ms"
                f"{r['mem'] / 2**20:>8.1f} MiB"
            )
    baselines = {"checkpoint": "h5py write", "restore": "h5py read", "verify": "h5py sha+meta"}
    ratios: dict[str, float] = {}
    for op, against, target in GOALS:
        ratio = rows[f"kaudit {op}"]["wall"] / rows[baselines[op]]["wall"]
        ratios[op] = ratio
        verdict = "PASS" if ratio <= target else "MISS"
        print(f"{verdict}  kaudit {op} / {against}: {ratio:.2f}x wall (target <= {target}x)")
    print(f"cost model (CPU): per MiB from the 4 arrays, per tensor the rest over {count - 4:,}")
    for op in ("checkpoint", "restore", "verify"):
        many, few = rows[f"kaudit {op}"]["cpu"], rows[f"kaudit {op} (4 arrays)"]["cpu"]
        per_mib = few / (nbytes / 2**20)
        per_tensor = (many - few) / (count - 4)
        print(
            f"      {op:10} {per_mib * 1e3:6.2f} ms per MiB, {per_tensor * 1e6:6.0f} us per tensor"
        )
    for what in ("wall", "cpu", "mem"):
        ours = rows["kaudit checkpoint"][what] + rows["kaudit restore"][what]
        theirs = rows["dcp save"][what] + rows["dcp load"][what]
        if what == "mem":
            ours = max(rows["kaudit checkpoint"][what], rows["kaudit restore"][what])
            theirs = max(rows["dcp save"][what], rows["dcp load"][what])
            print(
                f"      peak memory: kaudit +{ours / 2**20:.1f} MiB, DCP +{theirs / 2**20:.1f} "
                f"MiB (the state is {nbytes / 2**20:.1f} MiB; DCP loads into a template of "
                "it, kaudit's restore makes it)"
            )
            continue
        ratio = ours / theirs if theirs else float("inf")
        ratios[f"dcp {what}"] = ratio
        verdict = "PASS" if ratio <= DCP_TARGET else "MISS"
        print(
            f"{verdict}  kaudit checkpoint+restore / DCP save+load: {ratio:.2f}x {what} "
            f"(target <= {DCP_TARGET}x)"
        )
    return ratios


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="fresh processes per contender")
    p.add_argument("--repeat", type=int, default=3, help="timed operations per process")
    p.add_argument("--only", choices=CONTENDERS, action="append", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="a tiny state, once, in-process")
    p.add_argument("--worker", nargs=2, metavar=("NAME", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.width, args.rounds, args.repeat = 2, 8, 1, 1
    if args.worker is not None:
        name, out = args.worker
        _contender(name, args.layers, args.width, args.repeat, Path(out))
        return {}
    state = make_state(args.layers, args.width)
    flat = list(tensors(state))
    nbytes = sum(t.nbytes for _, t in flat)
    del state
    results: dict[str, dict[str, list[Sample]]] = {}
    names = list(args.only or CONTENDERS)
    from bench._common import run_fresh

    out = Path(tempfile.mkdtemp(prefix="kaudit-bench-many-"))
    try:
        for n in range(args.rounds):
            for name in names[n % len(names) :] + names[: n % len(names)]:
                target = out / f"{name}-{n}.json"
                if args.quick:
                    _contender(name, args.layers, args.width, args.repeat, target)
                else:
                    cmd = ["--layers", str(args.layers), "--width", str(args.width)]
                    cmd += ["--repeat", str(args.repeat), "--worker", name, str(target)]
                    run_fresh(__file__, cmd, name)
                got = json.loads(target.read_text())
                mine = results.setdefault(name, {})
                for op, samples in got.items():
                    mine.setdefault(op, []).extend(samples)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if args.only:
        for name in CONTENDERS:
            results.setdefault(name, {})
        for name, ops in results.items():
            for op, samples in ops.items():
                print(name, op, {w: round(_median(samples, w), 4) for w in ("wall", "cpu")})
        return {}
    runs = f"{args.rounds} process(es) per contender x {args.repeat} timed, medians"
    return report(results, len(flat), nbytes, runs)


if __name__ == "__main__":
    main()
