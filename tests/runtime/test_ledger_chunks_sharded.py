"""The ledger in chunks beside the steps of a sharded run: rank 0 writes each step's chunk
of the batches every rank recorded since the last, the one signed step manifest names
every chunk, no shard holds the ledger, and a restore on any rank count reads it back
from the chunks. Steps written with the ledger in every shard still restore, retention
keeps the chunks a kept step names, and `kaudit verify` checks them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.layout import STEP_MANIFEST, shard_path, step_directory
from kronos_audit.checkpoint.ledger import CHUNK_DIR, LedgerChunk, chunk_path
from kronos_audit.errors import CheckpointError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.runtime.steps.publisher import SignedPublisher
from kronos_audit.storage import cache_object_path, cache_settings
from tests.helpers import run_cli
from tests.runtime.test_ledger_chunks import batch
from tests.threadranks import ThreadRanks, on_ranks, thread_run

SEED = 5  # thread_run's
RUN = "mc"


def campaign(project: Project, ranks: int, n: int, **options: Any) -> list[ka.Ledger]:
    """The campaign of ``n`` batches on ``ranks`` thread ranks, a checkpoint a round;
    each rank's ledger at its end."""

    def program(comm: ThreadRanks) -> ka.Ledger:
        with thread_run(project.root, RUN, comm, **options) as run:
            run.restore()
            return run.map_batches(batch, n)

    ledgers: list[ka.Ledger] = on_ranks(ranks, program)
    return ledgers


def restored(project: Project, ranks: int) -> list[ka.Ledger]:
    def program(comm: ThreadRanks) -> ka.Ledger:
        with thread_run(project.root, RUN, comm) as run:
            run.restore()
            return run.ledger

    ledgers: list[ka.Ledger] = on_ranks(ranks, program)
    return ledgers


def chunks_of(run_dir: Path, step: int) -> tuple[LedgerChunk, ...]:
    return ka.read_manifest(step_directory(run_dir, step) / STEP_MANIFEST).record.ledger


def assert_serial(ledger: ka.Ledger, n: int) -> None:
    expected = {i: batch(ka.runtime.batch_rng(SEED, i)) for i in range(n)}
    assert ledger.indices() == list(range(n))
    for i, result in ledger.items():
        assert all(np.asarray(result[k]).tobytes() == expected[i][k].tobytes() for k in result)


def shard_has_ledger(run_dir: Path, step: int, rank: int, count: int) -> bool:
    with h5py.File(shard_path(step_directory(run_dir, step), rank, count)) as f:
        return "ledger" in f


def test_rank_0_writes_each_rounds_batches_as_one_chunk_the_step_manifest_names(
    project: Project, key: SigningKey
) -> None:
    ledgers = campaign(project, 3, 9)  # rounds of 3: steps 3, 6 and 9
    for ledger in ledgers:
        assert_serial(ledger, 9)
    run_dir = project.root / "checkpoints" / RUN
    for step in (3, 6, 9):
        chunks = chunks_of(run_dir, step)
        # The batches of every rank since the last step, in one chunk; the earlier named.
        assert [(c.first, c.count) for c in chunks] == [(k, 3) for k in range(0, step, 3)]
        if step > 3:
            assert chunks[:-1] == chunks_of(run_dir, step - 3)
        assert all(chunk_path(run_dir, c.sha256).is_file() for c in chunks)
        assert not any(shard_has_ledger(run_dir, step, r, 3) for r in range(3))
    with h5py.File(chunk_path(run_dir, chunks_of(run_dir, 6)[-1].sha256)) as f:
        assert list(f["ledger/index"][()]) == [3, 4, 5]  # ranks 0, 1 and 2's of round 2
    # On another rank count (an elastic re-forming), every rank reads the same chunks.
    for ledger in restored(project, 2):
        assert_serial(ledger, 9)
    ledgers = campaign(project, 2, 12)
    for ledger in ledgers:
        assert_serial(ledger, 12)
    chunks = chunks_of(run_dir, 12)
    assert [(c.first, c.count) for c in chunks] == [(0, 3), (3, 3), (6, 3), (9, 2), (11, 1)]
    verified = run_cli("verify", "--json", str(run_dir))
    assert verified.exit_code == 0, verified.output
    assert "all 5 chunks of the ledger match" in verified.stdout


def test_steps_with_the_ledger_in_every_shard_restore_and_go_on_in_chunks(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:  # as kaudit wrote sharded steps before chunks
        m.setattr(SignedPublisher, "ledger_in_chunks", False)
        campaign(project, 3, 6)
    run_dir = project.root / "checkpoints" / RUN
    assert chunks_of(run_dir, 6) == ()
    assert all(shard_has_ledger(run_dir, 6, r, 3) for r in range(3))
    for ledger in restored(project, 2):
        assert_serial(ledger, 6)
    for ledger in campaign(project, 3, 9):
        assert_serial(ledger, 9)
    # The first step after them writes the whole ledger as its first chunk.
    assert [(c.first, c.count) for c in chunks_of(run_dir, 9)] == [(0, 9)]
    assert not shard_has_ledger(run_dir, 9, 0, 3)


def test_a_chunk_changed_stops_the_restore_on_every_rank(project: Project, key: SigningKey) -> None:
    campaign(project, 2, 4)
    run_dir = project.root / "checkpoints" / RUN
    first = chunk_path(run_dir, chunks_of(run_dir, 4)[0].sha256)
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF
    first.unlink()
    first.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"ledger chunk: sha256 .* differs from the signed"):
        restored(project, 2)
    failed = run_cli("verify", str(run_dir))
    assert failed.exit_code == 1, failed.output
    assert f"changed: {CHUNK_DIR}/{first.name}" in failed.stdout


def test_retention_keeps_the_chunks_a_kept_sharded_step_names(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A ledger of at most 2 chunks: the third checkpoint writes it whole, once more.
    monkeypatch.setattr("kronos_audit.checkpoint.ledger.CHUNKS_LIMIT", 2)
    for ledger in campaign(project, 2, 8, keep=1):  # steps 2, 4, 6 and 8
        assert_serial(ledger, 8)
    run_dir = project.root / "checkpoints" / RUN
    newest = chunks_of(run_dir, 8)
    assert [(c.first, c.count) for c in newest] == [(0, 6), (6, 2)]
    here = sorted(p.name for p in (run_dir / CHUNK_DIR).glob("*.h5"))
    assert here == sorted(f"{c.sha256}.h5" for c in newest)
    cache_dir, _ = cache_settings(project)
    for step in (2, 4):
        for c in chunks_of(run_dir, step):
            assert not cache_object_path(cache_dir, c.md5).exists()
    for ledger in restored(project, 2):
        assert_serial(ledger, 8)
