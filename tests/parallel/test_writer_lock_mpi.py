"""One writer per run on several ranks, under a real mpiexec: a 2-rank job over a run that a
single process is writing fails on every rank, together, with the holder's line and exit 2;
never a hang, nothing written. Where the lock cannot hold, a 2-rank commit that would fork
the chain is refused on every rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.writer_lock import HOLDER_NAME, LOCK_NAME
from kronos_audit.statement.manifest import read_manifest
from tests.helpers import run_cli
from tests.parallel.launch import mpirun
from tests.signing.test_writer_lock import Writer, listing, trusted

pytestmark = pytest.mark.slow


def test_two_ranks_over_a_held_run_fail_on_every_rank_with_exit_2(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    first = Writer(project, tmp_path, "first", "3", "1")
    first.wait_paused()  # step 1 signed, the run's lock held by one process
    run_dir = project.root / "checkpoints" / "r"
    before = listing(run_dir)

    done = mpirun(2, *first.argv[1:4], "3", "-1", str(first.launches), cwd=project.root)

    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if "another process is writing" in line]
    assert len(lines) == 2, done.stderr  # each rank said it, alike
    assert all(f"pid {first.proc.pid}," in line for line in lines)
    assert "Traceback" not in done.stderr
    assert len(first.launches.read_text().splitlines()) == 3  # the holder, then both ranks
    assert listing(run_dir) == before  # nothing written, nothing removed

    first.go_on()
    status, out = first.finish()
    assert status == 0, first.stderr()
    assert out.get("step") == 3


def test_a_two_rank_commit_that_would_fork_the_chain_is_refused_on_every_rank(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    # As tests/signing/test_writer_lock.py's fork test, with sharded steps: the lock file
    # is removed under a 2-rank writer that holds it, and a second 2-rank writer signs.
    first = Writer(project, tmp_path, "first", "3", "1", ranks=2)
    first.wait_paused()  # step 1 signed by both ranks' votes
    run_dir = project.root / "checkpoints" / "r"
    (run_dir / LOCK_NAME).unlink()

    second = Writer(project, tmp_path, "second", "3", "-1", ranks=2)
    status, _ = second.finish()
    assert status == 0, second.stderr()
    signed = listing(run_dir)

    first.go_on()
    status, _ = first.finish()

    assert status != 0
    refused = [line for line in first.stderr().splitlines() if "refused to sign step 2" in line]
    assert len(refused) >= 2, first.stderr()  # every rank raised it
    assert "over step 1: its newest manifest is now step 3's" in refused[0]
    # No shard, index or manifest of the second writer's was replaced by the first's.
    changed = {n for n, stat in listing(run_dir).items() if signed.get(n) != stat}
    assert changed <= {HOLDER_NAME}
    result = run_cli("verify", str(run_dir), "--trusted-key", str(trusted(tmp_path, key)))
    assert result.exit_code == 0, result.output
    manifests = [
        read_manifest(run_dir / f"step-{s:08d}" / "index.jsonl.kaudit.json") for s in (1, 2, 3)
    ]
    assert manifests[0].record.parent is None
    assert manifests[1].record.parent == manifests[0].digest
    assert manifests[2].record.parent == manifests[1].digest
