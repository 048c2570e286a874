"""Storage benchmark: checkpoints in DVC-tracked remotes.

For a 1 GiB state: the time until a checkpoint is durable, hashed (sha256 of the file
and of every dataset, md5 for DVC), signed and in DVC's cache, against
  (a) a raw write+fsync of the same bytes, and
  (b) the naive path: an h5py write followed by DVC's own `dvc add` (Python API, DVC
      already imported, so neither side pays start-up).
Targets: at most 2x (a), and at least 1.5x faster than (b).

Run: .venv/bin/python bench/bench_storage.py [--gib 1.0] [--repeat 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import h5py
import numpy as np

# Run as a script, only bench/ is on sys.path: the repository root makes bench a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kronos_audit as ka
from bench._common import scratch_repo, wall_times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    repo = scratch_repo()
    n = int(args.gib * 2**30) // 8 // 4
    rng = np.random.default_rng(0)
    state = {f"a{i}": rng.random(n) for i in range(4)}
    size = sum(a.nbytes for a in state.values())

    from dvc.repo import Repo

    logging.disable(logging.INFO)
    # The naive user's repository: plain `git init` + `dvc init`, DVC's defaults.
    plain = repo.parent / "plain"
    plain.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=plain, check=True)
    dvc_repo = Repo.init(str(plain))

    def raw() -> None:
        with open(repo / "raw.bin", "wb") as f:
            for a in state.values():
                f.write(a.data)
            f.flush()
            os.fsync(f.fileno())

    def naive(i: int) -> None:
        path = plain / f"state-{i}.h5"
        with h5py.File(path, "w") as f:
            for k, a in state.items():
                f[k] = a
        dvc_repo.add(str(path))

    run_root = repo / "checkpoints"

    def clean() -> None:
        for d in (run_root, repo / ".dvc" / "cache"):
            shutil.rmtree(d, ignore_errors=True)
        for f in [repo / "raw.bin", *plain.glob("state-*")]:
            f.unlink(missing_ok=True)

    results: dict[str, list[float]] = {"raw": [], "kaudit": [], "naive": []}
    for i in range(args.repeat):
        state["a0"][0] = i  # new bytes each round: nothing is found in a cache already
        clean()
        results["raw"].append(wall_times(1, raw)[0])
        clean()
        # Run.steps would restore first; checkpoint the last step of a fresh run directly.
        results["kaudit"].append(wall_times(1, partial(kaudit_once, run_root, state, i + 1))[0])
        clean()
        results["naive"].append(wall_times(1, partial(naive, i))[0])
    clean()
    t_raw, t_ka, t_naive = (min(results[k]) for k in ("raw", "kaudit", "naive"))
    gb = size / 1e9
    print(f"state {size / 2**30:.2f} GiB (4 float64 arrays); best of {args.repeat}")
    print(f"  (a) raw write+fsync            {t_raw:6.2f} s  {gb / t_raw:5.2f} GB/s  baseline")
    print(
        f"  kaudit: durable, hashed, signed, in DVC cache  {t_ka:6.2f} s  "
        f"{t_ka / t_raw:.2f}x (a)  (target <= 2x)"
    )
    print(
        f"  (b) h5py write + dvc add       {t_naive:6.2f} s  kaudit is {t_naive / t_ka:.2f}x "
        f"faster  (target >= 1.5x)"
    )


def kaudit_once(root: Path, state: dict[str, np.ndarray], step: int) -> None:
    with ka.Run("bench", root=root, seed=0, every=ka.EverySteps(1), asynchronous=False) as run:
        run.checkpoint(step, state)


if __name__ == "__main__":
    main()
