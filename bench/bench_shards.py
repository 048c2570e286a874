"""Scale model of a sharded step: what a step manifest costs, and what one rank
pays to verify its own part at restore, at 1,000 and 100,000 ranks.

Measured rather than run at size: the shard index of n ranks is fabricated with real
digest formats (each line the sha256, md5 and size a 4 KiB shard would have), and only
the measured rank's own shard is a real file (an HDF5 shard written with
``write_and_digest``). Signing (``sign_sharded_step``) never reads a shard, and a rank's
restore verification (``Verifier.verify_rank``) reads no other rank's shard, so the
figures are the ones n real shards would give; only a whole-step verify, which hashes
every shard, is left out (it is linear in the step's bytes by nature, and ``--jobs``
spreads it).

Printed for each n: the step manifest's bytes, the index's and the Merkle tree's bytes,
the signing time (index and tree written, Merkle root, one signature), and one rank's
restore verification: signature, its own index line proven against the signed Merkle
root with log2(n) tree nodes, its own shard's size and sha256. Each time is given as a
ratio to the smallest n's figure and to a baseline measured in the same run: sha256 of
the rank's own shard's bytes (what any restore must pay). For comparison, the same
verification with the whole index hashed instead (what a rank pays when the tree file is
missing or damaged) shows the linear growth the Merkle proof avoids.

Figures of a run on the shared 2-core machine (best of 5; ms, ratios):

    ranks    manifest B  index B     tree B     sign  x1000  rank  x1000  x base  whole  x1000
    1,000    6,011       256,000     64,032     25.9  1.0    1.68  1.00   80      1.67   1.0
    100,000  6,031       25,600,000  6,400,192  1102  42.5   1.78  1.06   85      36.3   21.7

One rank's verification stays at about 1.7 ms from 1,000 to 100,000 ranks; its fixed part
(reading and schema-checking the manifest, one Ed25519 signature) is what makes it some
80 times the sha256 of a 6 KiB shard, and stays the same whatever the shard's size. The
whole-index fallback grows with n (36 ms at 100,000 ranks), and so does signing (rank 0
writes n lines and 2n tree nodes: 1.1 s at 100,000 ranks, once per step).

Run: .venv/bin/python bench/bench_shards.py [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

# Run as a script, only bench/ is on sys.path: the repository root makes bench a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import best_of, scratch_repo
from kronos_audit.checkpoint.layout import (
    INDEX_NAME,
    TREE_NAME,
    shard_name,
    shard_path,
    step_directory,
)
from kronos_audit.checkpoint.shards import LINE_WIDTH, ShardRecord, parse_line, read_index
from kronos_audit.checkpoint.writer import write_and_digest
from kronos_audit.keys.home import select_key
from kronos_audit.project.repository import find_project
from kronos_audit.provenance.environment import environment
from kronos_audit.provenance.gitstate import git_state
from kronos_audit.signing.sign import sign_sharded_step
from kronos_audit.verification.chain import ManifestCache
from kronos_audit.verification.verifier import Verifier

SHARD_FLOATS = 512
"""float64 values in the measured rank's shard: 4 KiB of data, a few KiB of HDF5."""


def fabricated(rank: int, count: int) -> ShardRecord:
    """The record a 4 KiB shard of ``rank`` would have: real digest formats, no file."""
    seed = b"%d/%d" % (rank, count)
    return ShardRecord(
        rank,
        shard_name(rank, count),
        hashlib.sha256(seed).hexdigest(),
        hashlib.md5(seed, usedforsecurity=False).hexdigest(),
        6144,
    )


def model(repo: Path, count: int, repeat: int) -> dict[str, Any]:
    """Sign a step of ``count`` ranks (one real shard, the others' records fabricated) and
    time one rank's restore verification of it."""
    project = find_project(repo)
    key = select_key(None)
    git = git_state(project.root)
    environment()  # captured once before timing: the first capture imports and probes
    directory = step_directory(repo / "runs" / f"n{count}", 1)
    directory.mkdir(parents=True)
    rank = count // 2
    digests = write_and_digest(
        shard_path(directory, rank, count),
        {"/u": np.arange(SHARD_FLOATS, dtype=np.float64) + rank},
        md5=True,
    )
    records = [fabricated(r, count) for r in range(count)]
    records[rank] = ShardRecord.of(rank, count, digests)

    def sign() -> object:
        return sign_sharded_step(
            directory,
            records,
            project=project,
            key=key,
            run=f"n{count}",
            step=1,
            layout={"u": {"shape": [count * SHARD_FLOATS], "dtype": "float64", "block": 0}},
            git=git,
            command=["mpiexec", "-n", str(count), "python", "solver.py"],
        )

    sign_s = best_of(repeat, sign)
    manifest = directory / (INDEX_NAME + ".kaudit.json")
    verifier = Verifier(project)

    def restore() -> None:
        # A fresh cache each time: a restarted rank has parsed nothing yet.
        verifier.cache = ManifestCache()
        result = verifier.verify_rank(manifest, rank, chain=False)
        assert result.ok, result.failures

    rank_s = best_of(repeat, restore)

    def whole_index() -> None:
        verifier.cache = ManifestCache()
        m = verifier.cache.read(manifest)
        assert verifier.signature(m).ok
        data = read_index(m.checkpoint_path, count)
        assert hashlib.sha256(data).hexdigest() == m.subject_sha256
        record = parse_line(data[rank * LINE_WIDTH : (rank + 1) * LINE_WIDTH], rank, count)
        with open(directory / record.name, "rb") as f:
            assert hashlib.file_digest(f, "sha256").hexdigest() == record.sha256

    whole_s = best_of(repeat, whole_index)
    shard_bytes = shard_path(directory, rank, count).read_bytes()

    def baseline() -> None:
        with open(shard_path(directory, rank, count), "rb") as f:
            hashlib.file_digest(f, "sha256")

    base_s = best_of(repeat * 4, baseline)
    figures = {
        "ranks": count,
        "manifest_bytes": manifest.stat().st_size,
        "index_bytes": (directory / INDEX_NAME).stat().st_size,
        "tree_bytes": (directory / TREE_NAME).stat().st_size,
        "shard_bytes": len(shard_bytes),
        "sign_s": sign_s,
        "rank_s": rank_s,
        "whole_index_s": whole_s,
        "baseline_s": base_s,
    }
    shutil.rmtree(directory.parent)
    return figures


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="100 and 1,000 ranks, fewer repeats (a smoke run)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="best of this many runs")
    args = parser.parse_args(argv)
    counts = (100, 1_000) if args.quick else (1_000, 100_000)
    repeat = 2 if args.quick else args.repeat
    repo = scratch_repo()
    try:
        rows = [model(repo, n, repeat) for n in counts]
    finally:
        shutil.rmtree(repo.parent, ignore_errors=True)
    first = rows[0]
    n0 = f"x{first['ranks']}"
    print(
        f"{'ranks':>8} {'manifest B':>10} {'index B':>11} {'tree B':>10} {'sign ms':>8} "
        f"{n0:>6} {'rank ms':>8} {n0:>6} {'x base':>7} {'whole-index ms':>14} {n0:>6} "
        f"{'x base':>7}"
    )
    for r in rows:
        print(
            f"{r['ranks']:>8,} {r['manifest_bytes']:>10,} {r['index_bytes']:>11,} "
            f"{r['tree_bytes']:>10,} {r['sign_s'] * 1e3:>8.1f} "
            f"{r['sign_s'] / first['sign_s']:>6.1f} {r['rank_s'] * 1e3:>8.2f} "
            f"{r['rank_s'] / first['rank_s']:>6.2f} {r['rank_s'] / r['baseline_s']:>7.1f} "
            f"{r['whole_index_s'] * 1e3:>14.2f} "
            f"{r['whole_index_s'] / first['whole_index_s']:>6.1f} "
            f"{r['whole_index_s'] / r['baseline_s']:>7.1f}"
        )
    base = ", ".join(f"{r['baseline_s'] * 1e6:.0f} us at {r['ranks']:,}" for r in rows)
    print(
        f"baseline: sha256 of the rank's own shard ({first['shard_bytes']:,} bytes): {base}\n"
        "rank ms: signature + its own line proven by the Merkle tree + its own shard; "
        "whole-index ms: the same with the whole index hashed instead (the fallback)"
    )
    last = rows[-1]
    grew = last["rank_s"] / first["rank_s"]
    print(
        f"one rank's restore verification at {last['ranks']:,} ranks costs {grew:.2f}x "
        f"what it costs at {first['ranks']:,}; the manifest is "
        f"{last['manifest_bytes'] - first['manifest_bytes']:+,} bytes apart"
    )
    return rows


if __name__ == "__main__":
    main()
