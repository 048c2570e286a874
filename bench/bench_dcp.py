"""What signing a torch DCP save costs against the plain DCP save of the same state.

One global state of ``--mib`` MiB (256 by default) of float32, as eight DTensors sharded by
rows over 2 ranks (gloo, one ``torchrun`` launch on this machine, in a scratch kaudit
repository: git, DVC, a trusted key), so each rank writes its half. Each round saves it
three ways, into fresh directories, in rotating order:

- ``plain``: ``dcp.save`` with DCP's own ``FileSystemWriter`` (fsync on, its default);
- ``signed``: ``dcp.save`` with :class:`kronos_audit.integrations.dcp.SignedWriter` as it
  comes: every buffer hashed as DCP writes it (each file's sha256 and md5, each item's
  sha256), the digests gathered to the coordinator with DCP's write results, and the step
  signed there and tracked by DVC, with the tensors by global name read back from the
  directory for the manifest;
- ``files``: the same with ``tensors=False``: files and items only, nothing read back.

Measured per save: the wall time from a barrier until the last rank returns, and the CPU
seconds of every rank (user and system, all threads) summed. Printed: the medians and the
ratios to ``plain``, with the target of at most 1.15x for each, PASS or MISS; and, as a
reference for where the time goes, the hashing alone of one rank's bytes on one core
(sha256 twice and md5 once, what the signed save adds per byte).

Run: .venv/bin/python bench/bench_dcp.py [--mib 256] [--repeat 5] [--quick]

Two runs on the shared 2-core machine, other work running (load 6-8), 256 MiB, median
of 5 (the second on a later main, after the rolling-restart and directory-step changes):

                  wall    cpu (sum of ranks)             wall    cpu
    plain       344 ms        173 ms                   293 ms    190 ms
    signed     4044 ms       2028 ms  11.8x, 11.7x    2674 ms   1692 ms   9.1x, 8.9x   MISS
    files      1500 ms        853 ms   4.4x,  4.9x    1665 ms    958 ms   5.7x, 5.0x   MISS
    hashing one rank's 128 MiB in memory on one core (sha256 twice, md5): 790 ms, 590 ms

(Hashing alone, before the step was signed, measured 3.3x wall and 4.75x CPU in an
earlier run of the same kind: signing, git state and DVC tracking add a fixed part.)

The target cannot be met while each byte is hashed three times, and the figures say why.
DCP's plain save is cheap in CPU: about 0.09 s a rank for 128 MiB (``torch.save`` of a
tensor is a copy into the zip and a write; the rest is the disk). On this machine, loaded,
sha256 ran at 1.4 GiB/s (90 ms for 128 MiB) and md5 at 0.6 GiB/s (206 ms). The signed save
must hash every byte with md5 (DVC's address of each file), with sha256 for the file (the
directory step's record of it) and with sha256 for the item (what the reader checks before
DCP unpickles or loads it): at least 0.39 s a rank, about four times what the plain save
spends, which is the ``files`` row. The default also reads the whole save back on the
coordinator to digest each tensor by its global name (a zip read with its CRC checked,
the chunks assembled, a sha256 of each tensor's canonical bytes): about 1.2 s of CPU more
for 256 MiB, on one rank, after the save. The wall time follows the CPU: both ranks'
hashing shares the two cores (two experiments, starting the disk's write-back before
hashing each buffer and hashing md5 on a second thread, changed nothing beyond the noise on
2 busy cores). What would lower it: one sha256 pass instead of two, by recording a DCP file
as its items' digests (the items tile the file) instead of a second whole-file sha256
(saves 90 of the 386 ms a rank); a faster storage hash than md5, which DVC 3 does not
offer; and each tensor's canonical digest taken from memory on the rank that writes it
(only whole tensors: a sharded one's global digest needs every chunk in order). None of
these reaches 1.15x.
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
from pathlib import Path
from typing import Any

# Run as a script, only bench/ is on sys.path: the repository root makes bench a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET = 1.15
"""Signed save's wall time and CPU seconds, each at most this times the plain save's."""
TENSORS = 8
MODES = ["plain", "signed", "files"]
"""DCP's own writer; the signing writer (its default: the tensors by global name read back
for the manifest); the signing writer with ``tensors=False`` (files and items only)."""


def _worker(mib: int, repeat: int, out: Path) -> None:
    """One rank of the launch: ``repeat`` pairs of saves, timings to ``out.<rank>.json``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from kronos_audit.integrations.dcp import SignedWriter

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (size,))
    rows = mib * 2**20 // 4 // TENSORS // 1024
    gen = torch.Generator().manual_seed(0)
    state = {
        f"t{i}": distribute_tensor(torch.rand(rows, 1024, generator=gen), mesh, [Shard(0)])
        for i in range(TENSORS)
    }
    base = Path.cwd() / "saves"  # in the scratch repository: signed steps are tracked there
    timings: dict[str, list[tuple[float, float, float]]] = {m: [] for m in MODES}
    for n in range(repeat + 1):  # the first round warms up: not counted
        order = MODES[n % len(MODES) :] + MODES[: n % len(MODES)]
        for mode in order:
            directory = base / f"{mode}-{n}"
            writer = (
                FileSystemWriter(directory)
                if mode == "plain"
                else SignedWriter(directory, run=mode, step=n, tensors=mode == "signed")
            )
            dist.barrier()
            t0, c0 = time.monotonic(), time.process_time()
            save(state, storage_writer=writer)
            t1, c1 = time.monotonic(), time.process_time()
            if n:
                timings[mode].append((t0, t1, c1 - c0))
            dist.barrier()
            if rank == 0:
                shutil.rmtree(directory)
                for sidecar in base.glob(f"{directory.name}.*"):
                    sidecar.unlink()
    mine = {"rank": rank, "bytes": sum(t.to_local().nbytes for t in state.values())}
    (out.parent / f"{out.name}.{rank}.json").write_text(json.dumps({**mine, **timings}))
    dist.destroy_process_group()


def _hashing(nbytes: int) -> float:
    """Seconds to hash ``nbytes`` in memory as the signed save does (sha256 twice, md5)."""
    data = os.urandom(1 << 20) * (nbytes >> 20)
    t0 = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    hashlib.sha256(data).hexdigest()
    hashlib.md5(data, usedforsecurity=False).hexdigest()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="8 MiB, 1 repeat: a smoke run")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.mib, args.repeat = 8, 1
    if args.worker is not None:
        _worker(args.mib, args.repeat, args.worker)
        return {}
    from bench._common import scratch_repo
    from tests.parallel.launch import launched, torchrun

    repo = scratch_repo()  # git, DVC, a trusted key: what signing a step needs
    scratch = Path(tempfile.mkdtemp(prefix="kaudit-bench-dcp-"))
    try:
        argv_ = [__file__, "--mib", str(args.mib), "--repeat", str(args.repeat)]
        done = launched(torchrun(2, *argv_, "--worker", str(scratch / "out")), repo)
        if done.returncode != 0:
            raise SystemExit(f"the launch failed:\n{done.stdout}{done.stderr}")
        ranks = [json.loads((scratch / f"out.{r}.json").read_text()) for r in range(2)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(repo.parent, ignore_errors=True)
    result: dict[str, Any] = {"mib": args.mib, "repeat": args.repeat}
    for mode in MODES:
        walls = [
            max(r[mode][n][1] for r in ranks) - min(r[mode][n][0] for r in ranks)
            for n in range(args.repeat)
        ]
        cpus = [sum(r[mode][n][2] for r in ranks) for n in range(args.repeat)]
        result[mode] = {"wall": statistics.median(walls), "cpu": statistics.median(cpus)}
    per_rank = max(r["bytes"] for r in ranks)
    result["hashing"] = _hashing(per_rank)
    print(
        f"DCP save of {args.mib} MiB on 2 ranks ({per_rank / 2**20:.0f} MiB a rank), "
        f"median of {args.repeat}"
    )
    print(f"{'':8}{'wall':>10}{'cpu (sum of ranks)':>22}")
    for mode in MODES:
        r = result[mode]
        print(f"{mode:8}{r['wall'] * 1e3:>8.0f} ms{r['cpu'] * 1e3:>19.0f} ms")
    goals = {}
    for mode in ("signed", "files"):
        for what in ("wall", "cpu"):
            ratio = result[mode][what] / result["plain"][what]
            goals[f"{mode} {what}"] = ratio
            verdict = "PASS" if ratio <= TARGET else "MISS"
            print(f"{mode} / plain {what}: {ratio:.2f}x (target <= {TARGET}x) {verdict}")
    print(
        f"baseline: hashing one rank's {per_rank / 2**20:.0f} MiB in memory on one core "
        f"(sha256 twice, md5): {result['hashing'] * 1e3:.0f} ms"
    )
    result["ratios"] = goals
    return result


if __name__ == "__main__":
    main()
