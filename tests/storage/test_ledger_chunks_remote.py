"""The ledger's chunks travel with the steps: ``Run(push=True)`` pushes each chunk with the
step that first names it, a fresh clone resumes the campaign from the DVC remote with
every chunk fetched at its signed sha256, and a chunk swapped in the remote is refused."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.ledger import CHUNK_DIR, chunk_path
from kronos_audit.errors import CheckpointSkipped
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage import Storage
from kronos_audit.storage.steps import ledger_items
from tests.helpers import git, run_cli
from tests.runtime.test_ledger_chunks import EVERY, SEED, assert_serial, batch

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
