"""What keeping a user's file safe costs a snapshot: its private copy in DVC's cache.

``kaudit snapshot`` of a file it did not write takes a private copy into DVC's cache (a
reflink where the file system has them, else ``copy_file_range``) and hashes the copy, so
that the program rewriting the file in place never changes a signed object. Before, the
file was hard-linked into the cache (no copy) and hashed where it was. Timed on an HDF5
file of one float64 dataset, warm page cache, best of 3, against:

- (a) hashing the file where it is (``digest_file``: sha256, md5 and the dataset's digest),
  which is what the hard link cost besides the hashing: nothing;
- (b) a plain ``cp`` of the file (``shutil.copyfile``), the copy's raw cost;
- kaudit: ``stage_copy`` then ``digest_file`` of the copy, as snapshot does.

Run: .venv/bin/python bench/bench_snapshot.py [--mib 256]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import h5py
import numpy as np

# Run as a script, only bench/ is on sys.path: the repository root makes bench a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import best_of, scratch_repo
from kronos_audit.checkpoint.hashing import digest_file
from kronos_audit.project.repository import find_project
from kronos_audit.storage.tracking import cache_settings, stage_copy


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=256.0, help="file size in MiB")
    args = parser.parse_args(argv)
    repo = scratch_repo()
    project = find_project(repo)
    path = repo / "restart.h5"
    n = int(args.mib * 2**20 / 8)
    with h5py.File(path, "w") as f:
        f["u"] = np.random.default_rng(0).standard_normal(n)
    cache_dir, types = cache_settings(project)
    size = path.stat().st_size
    digest_file(path, md5=True)  # warm the page cache

    def hashed_in_place() -> None:
        digest_file(path, md5=True)

    def plain_copy() -> None:
        shutil.copyfile(path, repo / "copy.h5")
        (repo / "copy.h5").unlink()

    def kaudit_copy() -> None:
        copy = stage_copy(path, cache_dir, types)
        try:
            digest_file(copy.path, md5=True)
        finally:
            copy.path.unlink()

    a = best_of(3, hashed_in_place)
    b = best_of(3, plain_copy)
    k = best_of(3, kaudit_copy)
    mb = size / 1e6
    print(f"file {size / 2**20:.0f} MiB (one float64 dataset); best of 3; cache.type {types}")
    print(f"  (a) hash in place (the hard link's cost)  {a:6.3f} s  {mb / a:7.0f} MB/s  baseline")
    print(f"  (b) cp of the file                        {b:6.3f} s  {mb / b:7.0f} MB/s")
    print(f"  kaudit: private copy, then hash it        {k:6.3f} s  {k / a:.2f}x (a)")
    return {"hash": a, "copy": b, "kaudit": k}


if __name__ == "__main__":
    main()
