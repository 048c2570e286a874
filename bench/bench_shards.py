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
  directory, last), as ``kronos_audit.runtime.pushing.Pusher`` does;
- a resume from the remote alone, in a second repository trusting the key (a machine that
  never held the run, its DVC cache empty): what rank 0 brings
  (``RemoteResume.newest(sharded=True)``: the step manifest, its chain (here of one step),
  the shard index checked against the signed sha256), then what one rank fetches and
  verifies, two ways: as ``bring_from_remote`` does on this branch (its
  ``_shards_of``: the whole index read, hashed and parsed to find the rank's line; its
  shard fetched by that line; then ``verify_rank``, which without a tree file hashes the
  whole index again), and by the Merkle proof (``proven_line`` with the tree file present:
  its line and log2(n) nodes; its shard fetched; ``verify_rank`` by the proof), with what
  fetching the tree costs rank 0 (the resume does not bring it today). Bytes are what the
  rank depends on, each file counted once.

Besides, rank 0's commit tracks every shard, the index and the tree with DVC (a cache
link, a git-ignore entry, a ``.dvc`` file each): measured on 32 real files, the median per
file times n + 2, an extrapolation that assumes (as measured) a flat cost per file.

Figures of a run on the shared 2-core machine (best of 3; ms, ratios), load 3-4
(``--repeat 3``; ``--quick`` gives the same shape at 100 and 1,000 ranks):

    ranks    manifest B  index B     tree B     sign  x1000  rank  x1000  x base  whole  x1000
    1,000    6,075       256,000     64,032     16.4  1.0    2.25  1.00   132     2.12   1.0
    100,000  6,095       25,600,000  6,400,192  1170  71.2   2.55  1.13   127     52.8   24.9

    rank 0 tracking: 2.8 ms a file, so 2.9 s a step at 1,000 ranks, 285 s at 100,000

    ranks    rank pushes B  ms    rank 0 pushes B  ms    rank 0 brings B  ms
    1,000    6,144          11.4  332,251          15.9  262,075          10.5
    100,000  6,144          12.1  32,012,431       29.1  25,606,095       73.7

    ranks    rank reads B  ms    x1000  by proof B  ms    x1000  rank 0 tree B  ms
    1,000    268,219       25.5  1.0    12,795      9.7   1.0    64,032         4.2
    100,000  25,612,239    1651  64.8   13,039      11.0  1.1    6,400,192      18.3

One rank's verification stays at about 2-2.5 ms from 1,000 to 100,000 ranks; its fixed
part (reading and schema-checking the manifest, one Ed25519 signature) is what makes it
some 130 times the sha256 of a 6 KiB shard, and stays the same whatever the shard's size.
The whole-index fallback grows with n (53 ms at 100,000 ranks), and so does signing
(rank 0 writes n lines and 2n tree nodes: 1.2 s at 100,000 ranks, once per step). So
does rank 0's DVC tracking, far more: some 3 ms a file, minutes a step at 100,000 ranks.

What a rank pushes does not grow with n (its shard, 11-12 ms, DVC's fixed cost); rank 0's
push grows with the index and tree (32 MB at 100,000 ranks, 29 ms to a local directory).
At a resume from the remote, what one rank fetches and verifies GROWS with n as the code
reads the index today: 25.6 MB and 1.65 s per rank at 100,000 ranks (65x the 1,000-rank
figure; parsing all 100,000 lines is most of it, 1.4 s, where hashing them is 23 ms), on
every rank at once. By the Merkle proof it does not: 13 KB and 10-11 ms per rank at either
count, for rank 0 fetching the 6.4 MB tree once (18 ms) or rebuilding it from the index.

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
from typing import Any, cast

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
    proven_line,
    read_index,
)
from kronos_audit.checkpoint.writer import write_and_digest
from kronos_audit.keys.home import select_key
from kronos_audit.project.repository import Project, find_project
from kronos_audit.provenance.environment import environment
from kronos_audit.provenance.gitstate import git_state
from kronos_audit.runtime.resume_remote import RemoteResume, push_manifest
from kronos_audit.runtime.sharded import ShardedPublisher
from kronos_audit.runtime.sharded_remote import _shards_of
from kronos_audit.runtime.sharded_steps import Agreed
from kronos_audit.signing.sign import sign_sharded_step
from kronos_audit.statement.manifest import Manifest, read_manifest
from kronos_audit.storage.fetch import FetchItem
from kronos_audit.storage.remote import Storage, configure_remote
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
    """What ``sharded_remote._shards_of`` asks of its publisher: where the run is, and
    which old ranks this rank reads (its own, the same rank count)."""

    directory: Path
    rank: int

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
        # The step brought (its manifest and index), this rank's shard not yet.
        if not (here / INDEX_NAME).exists():
            forget()
            bring()
        mine.unlink(missing_ok=True)
        (here / TREE_NAME).unlink(missing_ok=True)
        shutil.rmtree(cache, ignore_errors=True)

    def verify(verifier: Verifier) -> None:
        result = verifier.verify_rank(here / (INDEX_NAME + ".kaudit.json"), rank, chain=False)
        assert result.ok, result.failures

    def today() -> None:
        # What bring_from_remote does on each rank, then the restore's verification.
        needs, items = _shards_of(cast(ShardedPublisher, Reader(here.parent, rank)), 1)
        assert not far.fetch_many([items[old] for old in needs])
        verify(Verifier(elsewhere))

    today_s = best_fresh(repeat, unfetched, today)

    tree_digests = (tree.md5, tree.sha256, tree.size)

    def with_tree() -> None:
        unfetched()
        assert not far.fetch_many([FetchItem(here / TREE_NAME, *tree_digests)])

    def proven() -> None:
        # The same with the Merkle proof: its line and log2(n) nodes, not the index.
        m = read_manifest(here / (INDEX_NAME + ".kaudit.json"))
        assert m.record.shards is not None
        line = proven_line(here, rank, count, m.record.shards.root)
        assert not far.fetch_many([FetchItem(mine, line.md5, line.sha256, line.size)])
        verify(Verifier(elsewhere))

    proven_s = best_fresh(repeat, with_tree, proven)
    tree_fetch_s = best_fresh(
        repeat, unfetched, lambda: far.fetch_many([FetchItem(here / TREE_NAME, *tree_digests)])
    )
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
        "today_bytes": manifest_bytes + index.size + shard.size,
        "today_s": today_s,
        "proof_bytes": manifest_bytes + LINE_WIDTH + nodes * NODE + shard.size,
        "proof_s": proven_s,
        "tree_bytes": tree.size,
        "tree_fetch_s": tree_fetch_s,
    }


TRACKED = 32
"""Files tracked with DVC to measure what tracking one shard costs rank 0's commit."""


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
        "rank 0's commit also tracks every shard, the index and the tree with DVC: "
        f"{per_file * 1e3:.1f} ms a file (median of {TRACKED} tracked),\nso "
        + ", ".join(f"{per_file * (r['ranks'] + 2):,.1f} s a step at {r['ranks']:,}" for r in rows)
        + " ranks (n + 2 files, extrapolated)"
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
        "step) and the index, checked, into a repository that never held the run"
    )
    print(
        f"\n{'ranks':>8} {'rank reads B':>12} {'ms':>7} {n0:>6} {'x base':>7} "
        f"{'by proof B':>10} {'ms':>7} {n0:>6} {'x base':>7} {'rank 0 tree B':>13} {'ms':>7}"
    )
    for r in rows:
        print(
            f"{r['ranks']:>8,} {r['today_bytes']:>12,} {r['today_s'] * 1e3:>7.1f} "
            f"{r['today_s'] / first['today_s']:>6.1f} {r['today_s'] / r['baseline_s']:>7.0f} "
            f"{r['proof_bytes']:>10,} {r['proof_s'] * 1e3:>7.1f} "
            f"{r['proof_s'] / first['proof_s']:>6.1f} {r['proof_s'] / r['baseline_s']:>7.0f} "
            f"{r['tree_bytes']:>13,} {r['tree_fetch_s'] * 1e3:>7.1f}"
        )
    print(
        "one rank at a resume from the remote, once rank 0 brought the step: rank reads: as "
        "bring_from_remote\ndoes today (the whole index read, hashed and parsed to find its line, "
        "its shard fetched from the remote),\nthen verify_rank (no tree here: the whole "
        "index hashed again); by proof: its line and log2(n) tree\nnodes (proven_line), "
        "its shard fetched, verify_rank by the proof; rank 0 tree: fetching the tree\n"
        "from the remote, which the proof needs and the resume does not bring today"
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
        f"as the code reads the index today, {last['proof_s'] / first['proof_s']:.2f}x "
        "by the proof"
    )
    for r in rows:
        r["track_per_file_s"] = per_file
    return rows


if __name__ == "__main__":
    main()
