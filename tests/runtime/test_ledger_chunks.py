"""The ledger in chunks beside the steps: each checkpoint writes only the batches since the
last one, its signed manifest names every chunk of the ledger, a restore reads each at its
signed sha256, and a hostile chunk or list of chunks stops the restore in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit._internal.canonical import canonical_json
from kronos_audit.checkpoint.ledger import (
    CHUNK_DIR,
    LedgerChunk,
    chunk_path,
    read_chunks,
    write_chunk,
)
from kronos_audit.errors import CheckpointError
from kronos_audit.keys.home import generate_key
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from kronos_audit.runtime.campaigns.ledger import batch_rng
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.storage import cache_object_path, cache_settings
from tests.conftest import isolate
from tests.helpers import run_cli

SEED = 11
N = 20
EVERY = 6  # checkpoints at 6, 12, 18 and the last batch, 20


def batch(rng: np.random.Generator) -> dict[str, Any]:
    return {"x": rng.random(3), "n": np.int64(rng.integers(100))}


def serial(n: int) -> dict[int, dict[str, Any]]:
    return {i: batch(batch_rng(SEED, i)) for i in range(n)}


def manifest(run_dir: Path, step: int) -> Path:
    return run_dir / f"step-{step:08d}.h5.kaudit.json"


def chunks_of(run_dir: Path, step: int) -> tuple[LedgerChunk, ...]:
    return ka.read_manifest(manifest(run_dir, step)).record.ledger


def campaign(project: Project, run_id: str, n: int = N, **kwargs: Any) -> Path:
    root = project.root / "checkpoints"
    every = ka.EverySteps(EVERY)
    with ka.Run(run_id, root=root, seed=SEED, every=every, key=KEY[0], **kwargs) as run:
        run.restore()
        run.map_batches(batch, n)
    return root / run_id


def restored(project: Project, run_id: str) -> ka.Ledger:
    with ka.Run(run_id, root=project.root / "checkpoints", seed=SEED, key=KEY[0]) as run:
        run.restore()
        return run.ledger


def assert_serial(ledger: ka.Ledger, n: int = N) -> None:
    expected = serial(n)
    assert ledger.indices() == list(range(n))
    for i, result in ledger.items():
        assert all(np.asarray(result[k]).tobytes() == expected[i][k].tobytes() for k in result)


KEY: list[SigningKey] = []


@pytest.fixture(scope="module")
def finished(
    tmp_path_factory: pytest.TempPathFactory, repo_templates: tuple[Path, Path]
) -> tuple[Path, Path]:
    """A finished campaign's repository (made once: each test that changes it copies it),
    signed with a key the project trusts."""
    repo = tmp_path_factory.mktemp("chunks") / "repo"
    shutil.copytree(repo_templates[1], repo, symlinks=True)
    project = find_project(repo)
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp_path_factory.mktemp)
        KEY[:] = [generate_key("tester")]
        project.trust_store().add(KEY[0].private_key.public_key(), "tester")
        run_dir = campaign(project, "mc")
    return repo, run_dir


def copy_of(finished: tuple[Path, Path], tmp_path: Path) -> tuple[Project, Path]:
    repo, run_dir = finished
    dest = tmp_path / "repo"
    shutil.copytree(repo, dest, symlinks=True)
    return find_project(dest), dest / run_dir.relative_to(repo)


def test_each_checkpoint_writes_only_the_batches_since_the_last(
    finished: tuple[Path, Path],
) -> None:
    _, run_dir = finished
    steps = [6, 12, 18, 20]
    for k, step in enumerate(steps):
        chunks = chunks_of(run_dir, step)
        assert len(chunks) == k + 1
        # The chunks before are the parent's, referenced, not written again.
        assert chunks[:-1] == (chunks_of(run_dir, steps[k - 1]) if k else ())
        new = chunks[-1]
        assert (new.first, new.count) == (
            (steps[k - 1] if k else 0),
            step - (steps[k - 1] if k else 0),
        )
        with h5py.File(chunk_path(run_dir, new.sha256), "r") as f:
            assert list(f["ledger/index"][()]) == list(range(new.first, step))
        # The step's own file holds no ledger.
        with h5py.File(run_dir / f"step-{step:08d}.h5", "r") as f:
            assert "ledger" not in f
    names = sorted(p.name for p in (run_dir / CHUNK_DIR).glob("*.h5"))
    assert names == sorted(f"{c.sha256}.h5" for c in chunks_of(run_dir, 20))
    # Tracked by DVC, each chunk as a checkpoint file is.
    assert all((run_dir / CHUNK_DIR / f"{name}.dvc").is_file() for name in names)


def test_a_restore_reads_the_chunks_back(finished: tuple[Path, Path], tmp_path: Path) -> None:
    project, _ = copy_of(finished, tmp_path)
    assert_serial(restored(project, "mc"))


def test_a_resumed_campaign_goes_on_from_its_chunks(
    finished: tuple[Path, Path], tmp_path: Path
) -> None:
    project, run_dir = copy_of(finished, tmp_path)
    crashed = run_dir / CHUNK_DIR / ".kaudit-tmp-0123.h5"  # a chunk's write cut short
    crashed.write_bytes(b"half")
    campaign(project, "mc", n=N + 7)
    assert not crashed.exists()
    chunks = chunks_of(run_dir, N + 7)  # checkpoints at 24 and 27
    assert chunks[:-2] == chunks_of(run_dir, N)
    assert [(c.first, c.count) for c in chunks[-2:]] == [(N, 4), (N + 4, 3)]
    assert_serial(restored(project, "mc"), N + 7)


def resign(project: Project, path: Path, edit: Any) -> None:
    statement = json.loads(ka.read_manifest(path).envelope.payload)
    edit(statement["predicate"])
    path.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), KEY[0])))


def refused(project: Project) -> str:
    with pytest.raises(CheckpointError) as raised:
        restored(project, "mc")
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_a_chunk_swapped_missing_linked_or_oversized_stops_the_restore(
    finished: tuple[Path, Path], tmp_path: Path
) -> None:
    project, run_dir = copy_of(finished, tmp_path)
    first, second = (chunk_path(run_dir, c.sha256) for c in chunks_of(run_dir, N)[:2])
    saved = first.read_bytes()

    def swapped() -> None:
        first.unlink()
        shutil.copyfile(second, first)

    def oversized() -> None:
        first.unlink()
        first.write_bytes(saved + b"\0")

    def linked() -> None:
        first.unlink()
        first.symlink_to(tmp_path / "elsewhere.h5")

    (tmp_path / "elsewhere.h5").write_bytes(saved)
    for attack in (swapped, oversized, first.unlink, linked):
        attack()
        message = refused(project)
        assert first.name in message, (attack, message)
        first.unlink(missing_ok=True)
        first.write_bytes(saved)
    assert_serial(restored(project, "mc"))
    # The chunks' directory a link: not followed.
    ledger = run_dir / CHUNK_DIR
    ledger.rename(tmp_path / "moved")
    ledger.symlink_to(tmp_path / "moved")
    assert "link" in refused(project)


def test_a_manifest_naming_a_chunk_twice_or_out_of_order_is_refused(
    finished: tuple[Path, Path], tmp_path: Path
) -> None:
    project, run_dir = copy_of(finished, tmp_path)
    last = manifest(run_dir, N)
    original = last.read_bytes()

    def twice(predicate: dict[str, Any]) -> None:
        chunks = predicate["ledger"]
        chunks.append({**chunks[0], "first": chunks[-1]["first"] + chunks[-1]["count"]})

    def swapped(predicate: dict[str, Any]) -> None:
        chunks = predicate["ledger"]
        chunks[0], chunks[1] = chunks[1], chunks[0]

    for edit, says in ((twice, "twice"), (swapped, "out of order")):
        resign(project, last, edit)
        assert says in refused(project)
        last.write_bytes(original)
    assert_serial(restored(project, "mc"))


def test_retention_keeps_every_chunk_a_kept_step_names_and_removes_the_others(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A ledger of at most 2 chunks: the third checkpoint writes it whole, once more.
    monkeypatch.setattr("kronos_audit.checkpoint.ledger.CHUNKS_LIMIT", 2)
    root = project.root / "checkpoints"
    with ka.Run("kept", root=root, seed=SEED, every=ka.EverySteps(EVERY), keep=1) as run:
        run.map_batches(batch, N)
    run_dir = root / "kept"
    newest = ka.read_manifest(manifest(run_dir, N)).record.ledger
    # 6 and 12 in two chunks, 18 whole, 20 after it; only step 20 keeps its data.
    assert [(c.first, c.count) for c in newest] == [(0, 18), (18, 2)]
    here = sorted(p.name for p in (run_dir / CHUNK_DIR).glob("*.h5"))
    assert here == sorted(f"{c.sha256}.h5" for c in newest)
    dvc = sorted(p.name for p in (run_dir / CHUNK_DIR).glob("*.dvc"))
    assert dvc == [f"{name}.dvc" for name in here]
    cache_dir, _ = cache_settings(project)
    for step in (6, 12):
        for c in chunks_of(run_dir, step):
            assert not cache_object_path(cache_dir, c.md5).exists()
    for c in newest:
        assert cache_object_path(cache_dir, c.md5).exists()
    with ka.Run("kept", root=root, seed=SEED, key=key) as run:
        run.restore()
        assert_serial(run.ledger)


def test_kaudit_verify_checks_the_chunks_each_step_names(
    finished: tuple[Path, Path], tmp_path: Path
) -> None:
    project, run_dir = copy_of(finished, tmp_path)
    ok = run_cli("verify", "--allow-unanchored", "--json", str(run_dir), cwd=project.root)
    assert ok.exit_code == 0, ok.output
    assert "all 4 chunks of the ledger match" in ok.stdout
    first = chunk_path(run_dir, chunks_of(run_dir, 6)[0].sha256)
    first.unlink()
    first.write_bytes(b"not the chunk")
    failed = run_cli("verify", "--allow-unanchored", str(manifest(run_dir, N)), cwd=project.root)
    assert failed.exit_code == 1, failed.output
    assert f"changed: ledger/{first.name}" in failed.stdout
    first.unlink()
    failed = run_cli(
        "verify", "--allow-unanchored", "--no-fetch", str(manifest(run_dir, N)), cwd=project.root
    )
    assert failed.exit_code == 1, failed.output
    assert f"missing: ledger/{first.name}" in failed.stdout


def test_chunks_that_hold_a_batch_twice_between_them_are_refused(tmp_path: Path) -> None:
    def written(index: list[int], first: int) -> LedgerChunk:
        flat = {"/ledger/index": np.array(index), "/ledger/results": np.zeros(len(index))}
        d = write_chunk(tmp_path, flat)
        assert d.md5 is not None
        return LedgerChunk(d.sha256, d.md5, d.size, first, len(index))

    a, b = written([0, 2, 5], 0), written([1, 3, 4], 3)
    together = read_chunks(tmp_path, (a, b))
    assert list(together["/ledger/index"]) == [0, 2, 5, 1, 3, 4]
    with pytest.raises(CheckpointError, match="hold a batch twice"):
        read_chunks(tmp_path, (a, written([6, 2], 3)))
