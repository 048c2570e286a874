"""Comparison benchmark: the comparison engine and `kaudit diff`.

Two 1 GiB float64 datasets, each in its own HDF5 file, differing in most elements by a
few ULPs (as a replay that changed summation order would), compared at rtol=1e-12:

1. `compare_files` from the files, block by block (memory bounded by the block size);
2. baseline: `np.allclose` on the same two arrays already in memory, reference A in the
   same place (np.allclose(B, A) tests |B - A| <= atol + rtol * |A|).

Target: the comparison runs at no less than half np.allclose's speed (time ratio <= 2),
although it also reads both files and computes every statistic (max/mean abs and rel
error, max ULP, first and worst mismatch). Also printed: the raw read of both datasets
through h5py (the I/O floor), a bitwise-identical pair, and the comparison's peak memory
above the process's resting size. Warm page cache for everyone.

Run: .venv/bin/python bench/bench_compare.py [--gib 1.0] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

# Run as a script, only bench/ is on sys.path: the repository root makes bench a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import best_of
from kronos_audit.compare import TolerancePolicy, Verdict, compare_files
from kronos_audit.compare.engine import BLOCK_BYTES


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    try:  # Linux: writing 5 resets VmHWM to the current RSS
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of each dataset in GiB")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = int(args.gib * 2**30) // 8
    work = Path(tempfile.mkdtemp(prefix="kaudit-bench-compare-"))
    try:
        run(work, n, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def time_raw_read(paths: tuple[Path, Path], n: int, repeat: int) -> float:
    """Read both datasets block by block into one reused buffer: no comparison."""
    buf = np.empty(BLOCK_BYTES // 8)

    def read_both() -> None:
        for path in paths:
            with h5py.File(path, "r") as f:
                d = f["state"]
                for start in range(0, n, buf.size):
                    stop = min(start + buf.size, n)
                    d.read_direct(buf[: stop - start], np.s_[start:stop], np.s_[0 : stop - start])

    read_both()  # warm the page cache
    return best_of(repeat, read_both)


def time_allclose(fa: Path, fb: Path, repeat: int) -> float:
    """np.allclose with A as reference, both arrays in memory (freed on return)."""
    with h5py.File(fa, "r") as f:
        a = f["state"][...]
    with h5py.File(fb, "r") as f:
        b = f["state"][...]
    assert np.allclose(b, a, rtol=1e-12, atol=0.0)
    return best_of(repeat, lambda: np.allclose(b, a, rtol=1e-12, atol=0.0))


def run(work: Path, n: int, repeat: int) -> None:
    fa, fb, fc = work / "a.h5", work / "b.h5", work / "a-copy.h5"
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n)
    for path in (fa, fc):
        with h5py.File(path, "w") as f:
            f.create_dataset("state", data=a)
    b = a * (1 + rng.integers(-4, 5, n).astype(np.float64) * 2.0**-52)
    with h5py.File(fb, "w") as f:
        f.create_dataset("state", data=b)
    differ = int(np.count_nonzero(a != b))
    del a, b
    gc.collect()
    gib = n * 8 / 2**30
    print(f"two datasets of {gib:.2f} GiB float64; {differ / n:.0%} of elements differ")

    t_read = time_raw_read((fa, fb), n, repeat)

    # --- 1. compare_files at tolerance -------------------------------------------------
    policy = TolerancePolicy.from_options(rtol=1e-12)
    result = compare_files(fa, fb, policy)
    d = result.datasets[0]
    assert d.verdict is Verdict.WITHIN_TOLERANCE, d
    t_cmp = best_of(repeat, lambda: compare_files(fa, fb, policy))
    rest = _status_kib("VmRSS")
    peak_known = _reset_peak()
    compare_files(fa, fb, policy)
    peak_mib = (_status_kib("VmHWM") - rest) / 1024
    t_same = best_of(repeat, lambda: compare_files(fa, fc, policy))
    gc.collect()

    # --- 2. np.allclose on the arrays in memory ----------------------------------------
    t_allclose = time_allclose(fa, fb, repeat)
    gc.collect()

    gb = 2 * n * 8 / 1e9  # bytes read per comparison, both sides
    print(
        f"  h5py read of both datasets       {t_read:6.3f} s  ({gb / t_read:5.2f} GB/s)  I/O floor"
    )
    print(
        f"  np.allclose, arrays in memory    {t_allclose:6.3f} s  ({gb / t_allclose:5.2f} GB/s)  "
        "baseline"
    )
    print(
        f"  compare_files at rtol=1e-12      {t_cmp:6.3f} s  ({gb / t_cmp:5.2f} GB/s)  "
        f"ratio {t_cmp / t_allclose:.2f}x allclose's time = {t_allclose / t_cmp:.2f}x its speed "
        "(target >= 0.5x)"
    )
    print(
        f"  compare_files, identical files   {t_same:6.3f} s  ({gb / t_same:5.2f} GB/s)  "
        f"ratio {t_same / t_allclose:.2f}x allclose's time"
    )
    print(
        f"  comparison overhead over the raw read: {t_cmp / t_read:.2f}x; "
        f"max rel error {d.max_rel_error:.3g}, max ULP {d.max_ulp_error}"
    )
    if peak_known:
        print(
            f"  peak memory of one comparison above the resting process: {peak_mib:.0f} MiB "
            f"(block {BLOCK_BYTES / 2**20:.0f} MiB per side; datasets {gib:.2f} GiB each)"
        )


if __name__ == "__main__":
    main()
