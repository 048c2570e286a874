"""The ledger's chunks travel with the steps: ``Run(push=True)`` pushes each chunk with the
step that first names it, a fresh clone resumes the campaign from the DVC remote with
every chunk fetched at its signed sha256 (a sharded run's too, on another rank count), and
a chunk swapped in the remote is refused."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.layout import STEP_MANIFEST
from kronos_audit.checkpoint.ledger import CHUNK_DIR, chunk_path
from kronos_audit.errors import CheckpointSkipped
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage import Storage
from kronos_audit.storage.steps import ledger_items
from tests.helpers import git, run_cli
from tests.runtime.test_ledger_chunks import EVERY, SEED, assert_serial, batch
from tests.threadranks import ThreadRanks, on_ranks, thread_run

RUN = "mc"


def campaign(repo: Path, n: int) -> ka.Ledger:
    root = repo / "checkpoints"
    with ka.Run(RUN, root=root, seed=SEED, every=ka.EverySteps(EVERY), push=True) as run:
        run.restore()
        run.map_batches(batch, n)
        assert run.push_failures == []
        return run.ledger


def test_a_clone_resumes_the_campaign_from_the_remote_s_chunks(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    campaign(project.root, 14)  # checkpoints at 6, 12 and 14, each chunk pushed
    newest = ka.read_manifest(project.root / "checkpoints" / RUN / "step-00000014.h5.kaudit.json")
    assert len(newest.record.ledger) == 3
    items = ledger_items(newest.checkpoint_path.parent, newest.record.ledger)
    sizes = Storage(project).remote_sizes([i.md5 for i in items])
    assert sizes == {i.md5: i.size for i in items}

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is skipped
        ledger = campaign(clone, 20)
    assert_serial(ledger, 20)
    here = clone / "checkpoints" / RUN
    assert all(chunk_path(here, c.sha256).is_file() for c in newest.record.ledger)
    assert (here / CHUNK_DIR / f"{newest.record.ledger[0].sha256}.h5.dvc").is_file()
    assert run_cli("verify", str(here)).exit_code == 0


def restored_step(repo: Path) -> int | None:
    with ka.Run(RUN, root=repo / "checkpoints", seed=SEED, push=True) as run:
        run.restore()
        return run.step


def test_a_chunk_swapped_in_the_remote_is_not_taken(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    campaign(project.root, 14)
    run_dir = project.root / "checkpoints" / RUN
    chunks = ka.read_manifest(run_dir / "step-00000014.h5.kaudit.json").record.ledger
    first, second = chunks[0], chunks[1]
    stored = remote / "files" / "md5" / first.md5[:2] / first.md5[2:]
    other = remote / "files" / "md5" / second.md5[:2] / second.md5[2:]
    stored.chmod(0o644)
    stored.write_bytes(other.read_bytes())

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    with pytest.warns(CheckpointSkipped, match=f"ledger chunk {first.sha256}"):
        step = restored_step(clone)
    assert step is None  # every step needs the first chunk
    assert not chunk_path(clone / "checkpoints" / RUN, first.sha256).exists()


def test_a_sharded_campaign_s_chunks_are_pushed_and_a_clone_resumes_from_them(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    # Rank 0 writes and pushes each step's chunk with the step; a clone on another rank
    # count fetches them (rank 0, for every rank) and goes on.
    def program(repo: Path, n: int) -> Callable[[ThreadRanks], ka.Ledger]:
        def ranks(comm: ThreadRanks) -> ka.Ledger:
            with thread_run(repo, RUN, comm, push=True) as run:
                run.restore()
                ledger = run.map_batches(batch, n)
                assert run.push_failures == []
                return ledger

        return ranks

    on_ranks(2, program(project.root, 6))  # steps 2, 4 and 6
    step = project.root / "checkpoints" / RUN / "step-00000006"
    newest = ka.read_manifest(step / STEP_MANIFEST)
    assert len(newest.record.ledger) == 3
    items = ledger_items(step.parent, newest.record.ledger)
    assert Storage(project).remote_sizes([i.md5 for i in items]) == {i.md5: i.size for i in items}

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is skipped
        ledgers = on_ranks(3, program(clone, 9))
    expected = {i: batch(ka.runtime.batch_rng(5, i)) for i in range(9)}
    for ledger in ledgers:
        assert ledger.indices() == list(range(9))
        assert all(
            ledger[i][k].tobytes() == np.asarray(expected[i][k]).tobytes()
            for i in range(9)
            for k in expected[i]
        )
    here = clone / "checkpoints" / RUN
    assert all(chunk_path(here, c.sha256).is_file() for c in newest.record.ledger)
    assert run_cli("verify", str(here), cwd=clone).exit_code == 0
