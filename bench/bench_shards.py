"""Scale model of a sharded step at 1,000 and 100,000 ranks: what its manifest costs,
and what one rank pays to verify its own part at restore, to push it and to resume it
from the DVC remote.

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

Then the DVC remote (a real local directory remote, emptied before each push), measured
for the one real shard and the real index and tree:

- the push: what one rank pushes after a commit (its shard, confirmed in the remote), and
  rank 0 (its shard, the index and the tree, then the step manifest in the run's remote
  directory, last), as ``kronos_audit.runtime.remote.push.Pusher`` does;
- a resume from the remote alone, in a second repository trusting the key (a machine that
  never held the run, its DVC cache empty): what rank 0 brings
  (``RemoteResume.newest(sharded=True)``: the step manifest, its chain (here of one step),
  the shard index checked against the signed sha256, and the index's Merkle tree rebuilt
  from it, its root checked against the signed one), then what one rank fetches and
  verifies as ``bring_from_remote`` does (its ``_shards_of``: its line proven against the
  signed root with log2(n) tree nodes; its shard fetched by that line; then
  ``verify_rank`` by the proof), and for comparison the same with no tree here (the
  fallback: the whole index read, hashed and parsed, then hashed again). Bytes are what
  the rank depends on, each file counted once.

Besides, DVC tracking (a cache link, a git-ignore entry, a ``.dvc`` file each): measured
on 32 real files, the median per file. Each rank tracks its own shard before it votes, and
rank 0 the index and the tree besides: 1 file a rank and 3 on rank 0, whatever n. (Rank 0
once tracked every shard, n + 2 files: 2.7 s a step at 1,000 ranks, 267 s at 100,000.)

Figures of a run on the shared 2-core machine (best of 3; ms, ratios), load 3-4
(``--repeat 3``; ``--quick`` gives the same shape at 100 and 1,000 ranks):

    ranks    manifest B  index B     tree B     sign  x1000  rank  x1000  x base  whole  x1000
    1,000    6,071       256,000     64,032     15.9  1.0    2.14  1.00   118     2.05   1.0
    100,000  6,091       25,600,000  6,400,192  903   56.8   1.94  0.91   117     46.3   22.6

    DVC tracking: 2.7 ms a file: 2.7 ms a rank, 8 ms on rank 0, at any rank count

    ranks    rank pushes B  ms    rank 0 pushes B  ms    rank 0 brings B  ms
    1,000    6,144          10.0  332,247          14.5  262,071          12.3
    100,000  6,144          9.8   32,012,427       27.4  25,606,091       249

    ranks    rank reads B  ms    x1000  x base  no tree B   ms    x1000
    1,000    12,791        8.4   1.0    483     268,215     21.4  1.0
    100,000  13,035        9.4   1.1    535     25,612,235  1478  69.1

One rank's verification stays at about 2 ms from 1,000 to 100,000 ranks; its fixed part
(reading and schema-checking the manifest, one Ed25519 signature) is what makes it some
120 times the sha256 of a 6 KiB shard, and stays the same whatever the shard's size. The
whole-index fallback grows with n (46 ms at 100,000 ranks), and so does signing (rank 0
writes n lines and 2n tree nodes: 0.9 s at 100,000 ranks, once per step). DVC tracking
does not: each rank tracks its own shard, some 3 ms, and rank 0 two files more.

What a rank pushes does not grow with n (its shard, 10 ms, DVC's fixed cost); rank 0's
push grows with the index and tree (32 MB at 100,000 ranks, 27 ms to a local directory).
At a resume from the remote, what one rank fetches and verifies does not grow with n: its
line and log2(n) tree nodes, 13 KB and 9-10 ms per rank at either count (1.1x), because
rank 0 rebuilt the index's tree once it brought the index (25.6 MB and 0.25 s at 100,000
ranks, once). Without the tree, every rank would read, hash and parse the whole index:
25.6 MB and 1.5 s per rank at 100,000 ranks, 69x the 1,000-rank figure.

Run: .venv/bin/python bench/bench_shards.py [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
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
from kronos_audit.checkpoint.shards import (
    LINE_WIDTH,
    NODE,
    ShardRecord,
    level_sizes,
    parse_line,
    read_index,
)
from kronos_audit.checkpoint.writer import write_and_digest
from kronos_audit.keys.home import select_key
from kronos_audit.project.repository import Project, find_project
from kronos_audit.provenance.environment import environment
from kronos_audit.provenance.gitstate import git_state
from kronos_audit.runtime.remote.resume import RemoteResume
from kronos_audit.runtime.remote.shard_fetch import _shards_of
from kronos_audit.runtime.steps.layouts import Agreed
from kronos_audit.signing.sign import sign_sharded_step
from kronos_audit.statement.manifest import Manifest
from kronos_audit.storage.fetch import FetchItem
from kronos_audit.storage.remote import Storage, configure_remote
from kronos_audit.storage.remote_chain import push_manifest
from kronos_audit.storage.runs import RunFiles
from kronos_audit.storage.tracking import track
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


def best_fresh(n: int, setup: Callable[[], object], fn: Callable[[], object]) -> float:
    """Best wall time of n runs of ``fn``, each after an untimed ``setup`` that puts back
    the state a first run meets (an empty remote, nothing fetched yet)."""
    times = []
    for _ in range(n):
        setup()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def emptied(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


@dataclass(frozen=True)
class Reader:
    """What ``shard_fetch._shards_of`` asks of the run (a ``ShardReader``): where the run
    is, whose it is, what verifies its step manifest, and which old ranks this rank reads
    (its own, the same rank count)."""

    directory: Path
    rank: int
    run_id: str
    trusts: Verifier

    def verifier(self) -> Verifier:
        return self.trusts

    def reads(self, agreed: Agreed) -> list[int]:
        return [self.rank]


def tracked(project: Project, path: Path, pattern: str) -> FetchItem:
    """Put ``path`` into DVC's cache, as a commit does, and give it as a push names it."""
    data = path.read_bytes()
    md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
    track(project, path, md5, len(data), owned=True, ignore_pattern=pattern)
    return FetchItem(path, md5, hashlib.sha256(data).hexdigest(), len(data))


def remote_figures(
    repo: Path, other: Path, remote: Path, manifest: Manifest, rank: int, repeat: int
) -> dict[str, Any]:
    """One rank's push of the signed step at ``manifest`` to a local directory DVC remote
    (``remote``), rank 0's, and one rank's resume of it from there into ``other`` (a
    repository without the step, as on another machine): bytes and best times."""
    count = manifest.record.shards.count if manifest.record.shards else 0
    directory = manifest.checkpoint_path.parent
    run = directory.parent.name
    project = find_project(repo)
    shard = tracked(project, shard_path(directory, rank, count), "/rank-*.h5")
    index = tracked(project, directory / INDEX_NAME, "/" + INDEX_NAME)
    tree = tracked(project, directory / TREE_NAME, "/" + TREE_NAME)
    configure_remote(project, str(remote))
    storage = Storage(project)
    storage.remote_name()  # DVC opened before timing: a running job's pusher has it open

    def push(items: list[FetchItem], manifest_too: bool) -> None:
        assert storage.push(items) == len(items)  # each uploaded, not found there already
        if manifest_too:
            push_manifest(RunFiles(storage, run), manifest.path)

    rank_push_s = best_fresh(repeat, lambda: emptied(remote), lambda: push([shard], False))
    # Rank 0: its shard (a stand-in of the same size), the index and tree, then the step
    # manifest; left in the remote for the resume below.
    zero_push_s = best_fresh(
        repeat, lambda: emptied(remote), lambda: push([shard, index, tree], True)
    )

    elsewhere = find_project(other)
    configure_remote(elsewhere, str(remote))
    far = Storage(elsewhere)
    far.remote_name()
    cache = far.cache_settings()[0]
    here = other / directory.relative_to(repo)
    mine = here / shard.checkpoint.name

    def forget() -> None:
        # Nothing of the step here, and nothing in DVC's cache: every byte comes from the
        # remote, as on a machine that never held the run.
        shutil.rmtree(here.parent, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)

    def bring() -> None:
        found = RemoteResume(
            elsewhere,
            far,
            RunFiles(far, run),
            here.parent,
            lambda: Verifier(elsewhere),
            lambda verifier, path: None,
            UserWarning,
        ).newest(None, stacklevel=1, sharded=True)
        assert found is not None
        assert found.step == 1, found

    bring_s = best_fresh(repeat, forget, bring)

    def unfetched() -> None:
        # The step brought (its manifest, the index and the tree rank 0 rebuilt from it),
        # this rank's shard not yet.
        if not (here / INDEX_NAME).exists():
            forget()
            bring()
        mine.unlink(missing_ok=True)
        shutil.rmtree(cache, ignore_errors=True)

    def treeless() -> None:
        # The same with no tree here (damaged, or not rebuilt): the fallback.
        unfetched()
        (here / TREE_NAME).unlink(missing_ok=True)

    def verify(verifier: Verifier) -> None:
        result = verifier.verify_rank(here / (INDEX_NAME + ".kaudit.json"), rank, chain=False)
        assert result.ok, result.failures

    def resume() -> None:
        # What bring_from_remote does on each rank, then the restore's verification.
        reader = Reader(here.parent, rank, manifest.run, Verifier(elsewhere))
        needs, items, _ = _shards_of(reader, 1)
        assert not far.fetch_many([items[old] for old in needs])
        verify(Verifier(elsewhere))

    today_s = best_fresh(repeat, unfetched, resume)
    fallback_s = best_fresh(repeat, treeless, resume)
    nodes = sum(1 for i, size in enumerate(level_sizes(count)[:-1]) if (rank >> i) ^ 1 < size)
    manifest_bytes = manifest.path.stat().st_size
    shutil.rmtree(here.parent, ignore_errors=True)
    # The tracking and the remote left the repository dirty: a later step signed here
    # would record a patch, and its manifest would grow for that alone.
    for args in (["checkout", "-q", "--", "."], ["clean", "-fdq"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return {
        "rank_push_bytes": shard.size,
        "zero_push_bytes": shard.size + index.size + tree.size + manifest_bytes,
        "rank_push_s": rank_push_s,
        "zero_push_s": zero_push_s,
        "bring_bytes": manifest_bytes + index.size,
        "bring_s": bring_s,
        "today_bytes": manifest_bytes + LINE_WIDTH + nodes * NODE + shard.size,
        "today_s": today_s,
        "fallback_bytes": manifest_bytes + index.size + shard.size,
        "fallback_s": fallback_s,
    }


TRACKED = 32
"""Files tracked with DVC to measure what tracking one shard costs a rank's commit."""


def tracking_per_file(repo: Path) -> float:
    """Median seconds of ``track`` (DVC cache link, git-ignore entry, ``.dvc`` file) for
    one small shard, as rank 0's commit does for every shard of a step: measured on
    TRACKED real files (the cost per file does not depend on how many a step has)."""
    project = find_project(repo)
    directory = step_directory(repo / "runs" / "tracked", 1)
    directory.mkdir(parents=True)
    times = []
    for r in range(TRACKED):
        path = shard_path(directory, r, TRACKED)
        data = np.arange(SHARD_FLOATS, dtype=np.float64).tobytes() + b"%d" % r
        path.write_bytes(data)
        md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
        t0 = time.perf_counter()
        track(project, path, md5, len(data), owned=True, ignore_pattern="/rank-*.h5")
        times.append(time.perf_counter() - t0)
    shutil.rmtree(directory.parent)
    for args in (["checkout", "-q", "--", "."], ["clean", "-fdq"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return sorted(times)[len(times) // 2]


def model(repo: Path, other: Path, remote: Path, count: int, repeat: int) -> dict[str, Any]:
    """Sign a step of ``count`` ranks (one real shard, the others' records fabricated),
    time one rank's restore verification of it, its push and its resume from the remote."""
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
            layout={"u": {"block": 0, "shape": [count * SHARD_FLOATS]}},  # as a run writes it
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
        **remote_figures(
            repo, other, remote / f"n{count}", verifier.cache.read(manifest), rank, repeat
        ),
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
    home = os.environ["KAUDIT_HOME"]
    # The machine a run resumes on: another repository, trusting the same key.
    other = scratch_repo()
    os.environ["KAUDIT_HOME"] = home
    find_project(other).trust_store().add(select_key(None).private_key.public_key(), "bench-origin")
    try:
        per_file = tracking_per_file(repo)
        rows = [model(repo, other, repo.parent / "remote", n, repeat) for n in counts]
    finally:
        shutil.rmtree(repo.parent, ignore_errors=True)
        shutil.rmtree(other.parent, ignore_errors=True)
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
    print(
        "DVC tracking: each rank its own shard before it votes, rank 0 the index and the "
        f"tree besides: {per_file * 1e3:.1f} ms a file (median of {TRACKED} tracked),\nso "
        f"{per_file * 1e3:.1f} ms a rank and {3 * per_file * 1e3:.1f} ms on rank 0 at "
        + " and at ".join(f"{r['ranks']:,}" for r in rows)
        + " ranks alike"
    )
    print(
        f"\n{'ranks':>8} {'rank pushes B':>13} {'ms':>7} {'rank 0 pushes B':>15} {'ms':>7} "
        f"{'rank 0 brings B':>15} {'ms':>7}"
    )
    for r in rows:
        print(
            f"{r['ranks']:>8,} {r['rank_push_bytes']:>13,} {r['rank_push_s'] * 1e3:>7.1f} "
            f"{r['zero_push_bytes']:>15,} {r['zero_push_s'] * 1e3:>7.1f} "
            f"{r['bring_bytes']:>15,} {r['bring_s'] * 1e3:>7.1f}"
        )
    print(
        "a local directory DVC remote, emptied before each push; rank pushes: its shard, "
        "confirmed there; rank 0\npushes: its shard, the index and tree, then the step "
        "manifest; rank 0 brings (a resume elsewhere): the\nstep manifest (a chain of one "
        "step), the index checked and its tree rebuilt, into a repository that never held the run"
    )
    print(
        f"\n{'ranks':>8} {'rank reads B':>12} {'ms':>7} {n0:>6} {'x base':>7} "
        f"{'no tree B':>11} {'ms':>7} {n0:>6}"
    )
    for r in rows:
        print(
            f"{r['ranks']:>8,} {r['today_bytes']:>12,} {r['today_s'] * 1e3:>7.1f} "
            f"{r['today_s'] / first['today_s']:>6.1f} {r['today_s'] / r['baseline_s']:>7.0f} "
            f"{r['fallback_bytes']:>11,} {r['fallback_s'] * 1e3:>7.1f} "
            f"{r['fallback_s'] / first['fallback_s']:>6.1f}"
        )
    print(
        "one rank at a resume from the remote, once rank 0 brought the step (and rebuilt the "
        "index's tree):\nrank reads: as bring_from_remote does (its line and log2(n) tree "
        "nodes, proven_line; its shard fetched\nfrom the remote), then verify_rank by the "
        "proof; no tree: the same with the tree gone (the whole\nindex read, hashed and "
        "parsed, then hashed again by verify_rank): the fallback"
    )
    last = rows[-1]
    grew = last["rank_s"] / first["rank_s"]
    print(
        f"one rank's restore verification at {last['ranks']:,} ranks costs {grew:.2f}x "
        f"what it costs at {first['ranks']:,}; the manifest is "
        f"{last['manifest_bytes'] - first['manifest_bytes']:+,} bytes apart"
    )
    print(
        f"one rank's resume work at {last['ranks']:,} ranks costs "
        f"{last['today_s'] / first['today_s']:.2f}x what it costs at {first['ranks']:,} "
        f"by the proof, {last['fallback_s'] / first['fallback_s']:.2f}x with no tree"
    )
    for r in rows:
        r["track_per_file_s"] = per_file
    return rows


if __name__ == "__main__":
    main()
