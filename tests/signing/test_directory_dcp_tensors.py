"""A torch DCP directory step: verify names the tensor by its global name, diff at a
tolerance compares by value, and the tensors come from the bytes that were hashed (a file
swapped between hashing and reading changes nothing that is signed or parsed). One DCP
save, copied for each test."""

from __future__ import annotations

import os
import pickle
import shutil
import struct
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
import kronos_audit.checkpoint.directory as directory
from kronos_audit.checkpoint.directory import FileEntry
from kronos_audit.checkpoint.formats import registry
from kronos_audit.checkpoint.hashing import FileDigests, OpenFile, array_digest
from kronos_audit.errors import CheckpointError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.helpers import run_cli

W = np.arange(12, dtype=np.float32).reshape(4, 3) + 0.25
B = np.full(4, 7.0, dtype=np.float32)

pytestmark = pytest.mark.slow  # torch's import: seconds of its own


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    where = tmp_path_factory.mktemp("dcp") / "save"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"w": torch.from_numpy(W), "b": torch.from_numpy(B)}, checkpoint_id=str(where))
    return where


def _copy(saved: Path, to: Path, w: np.ndarray | None = None) -> Path:
    shutil.copytree(saved, to)
    if w is not None:
        _rewrite(to / "__0_0.distcp", W, w)
    return to


def _rewrite(path: Path, old: np.ndarray, new: np.ndarray) -> None:
    """Replace ``old``'s bytes in the chunk file ``path`` by ``new``'s, as a writer of a
    valid file would: the CRC-32 recorded of the zip member made to agree."""
    data = path.read_bytes()
    path.unlink()  # DVC's cache holds the signed bytes under this inode
    path.write_bytes(_changed(data, old, new))


def _changed(data: bytes, old: np.ndarray, new: np.ndarray) -> bytes:
    # The member is the tensor's storage, exactly: its CRC is that of the array's bytes.
    assert data.count(old.tobytes()) == 1
    crc_old, crc_new = (struct.pack("<I", zlib.crc32(a.tobytes())) for a in (old, new))
    assert data.count(crc_old) >= 1
    return data.replace(old.tobytes(), new.tobytes()).replace(crc_old, crc_new)


def _evil_metadata(marker: Path) -> bytes:
    """A pickle that starts as DCP's does, then runs a command if unpickled."""
    from torch.distributed.checkpoint.metadata import Metadata

    class Evil:
        def __reduce__(self) -> tuple[object, ...]:
            return (os.system, (f"touch {marker}",))

    return pickle.dumps((Metadata, Evil()))


def test_verify_names_the_tensor_by_its_global_name(
    saved: Path, project: Project, key: SigningKey, tmp_path: Path
) -> None:
    step = _copy(saved, project.root / "dcp" / "step-1")
    (m,) = ka.snapshot(step, run="dcp", step=1)
    _rewrite(step / "__0_0.distcp", W, W + 1)
    done = run_cli("verify", str(step))
    assert done.exit_code == 1, done.output
    assert "files: changed: __0_0.distcp" in done.output
    assert "dataset /w: content hash" in done.output
    assert "dataset /b" not in done.output
    # .metadata changed too: it is not parsed, and verify says so.
    marker = tmp_path / "ran"
    (step / ".metadata").unlink()
    (step / ".metadata").write_bytes(_evil_metadata(marker))
    done = run_cli("verify", str(step))
    assert done.exit_code == 1
    assert "the step's dcp tensors cannot be read: .metadata is not the signed one" in done.output
    assert not marker.exists()
    # The signed .metadata back, a chunk file gone: the tensors it holds cannot be read.
    shutil.copy(saved / ".metadata", step / ".metadata")
    (step / "__0_0.distcp").unlink()
    done = run_cli("verify", str(step))
    assert done.exit_code == 1
    assert "files: missing: __0_0.distcp" in done.output
    assert "dataset /w: cannot be read: its chunk file __0_0.distcp is not there" in done.output
    assert m.datasets is not None


def test_diff_at_a_tolerance_compares_dcp_tensors_by_value(
    saved: Path, project: Project, key: SigningKey
) -> None:
    a = _copy(saved, project.root / "dcp" / "step-1")
    b = _copy(saved, project.root / "dcp" / "step-2", w=W * np.float32(1 + 1e-6))
    (ma,) = ka.snapshot(a, run="dcp", step=1)
    (mb,) = ka.snapshot(b, run="dcp", step=2, parent=ma.path)
    assert mb.datasets is not None
    assert array_digest("/w", W * np.float32(1 + 1e-6)) in mb.datasets
    assert run_cli("diff", str(a), str(b), "--rtol", "1e-4").exit_code == 0
    outside = run_cli("diff", str(a), str(b), "--rtol", "1e-9")
    assert outside.exit_code == 1, outside.output
    assert "/w" in outside.output
    assert "DIFFERENT" in outside.output


@pytest.fixture
def swap_after_hashing(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, bytes]]:
    """Each file named in the dict is replaced on disk (by rename) by the bytes given,
    right after snapshot or verify hashed it: what a writer racing the read would do
    (``in place:NAME``: written into the file itself)."""
    swaps: dict[str, bytes] = {}

    def replace(opened: OpenFile) -> None:
        new = swaps.pop(opened.path.name, None)
        if new is not None:
            spare = opened.path.with_name(opened.path.name + ".new")
            spare.write_bytes(new)
            spare.replace(opened.path)
        new = swaps.pop("in place:" + opened.path.name, None)
        if new is not None:
            with open(opened.path, "r+b") as f:  # the same file: the descriptor sees it
                f.write(new)

    digest_opened, hash_one = registry.digest_opened, directory._hash_one

    def digest_then_swap(opened: OpenFile, *, md5: bool = False) -> FileDigests:
        try:
            return digest_opened(opened, md5=md5)
        finally:
            replace(opened)

    def hash_then_swap(
        opened: OpenFile, f: FileEntry, seen: tuple[int, int, int], *, private: bool
    ) -> tuple[str | None, str]:
        try:
            return hash_one(opened, f, seen, private=private)
        finally:
            replace(opened)

    monkeypatch.setattr(directory, "digest_opened", digest_then_swap)
    monkeypatch.setattr(directory, "_hash_one", hash_then_swap)
    yield swaps
    assert not swaps, "every swap happened"


def test_dcp_tensors_come_from_the_bytes_hashed(
    saved: Path,
    project: Project,
    key: SigningKey,
    tmp_path: Path,
    swap_after_hashing: dict[str, bytes],
) -> None:
    step = _copy(saved, project.root / "dcp" / "step-1")
    changed = _changed((step / "__0_0.distcp").read_bytes(), W, W * 2)
    marker = tmp_path / "ran"
    # At snapshot: both files swapped right after each was hashed. The signed tensors are
    # those of the hashed bytes, and the swapped-in .metadata is never parsed.
    swap_after_hashing.update({"__0_0.distcp": changed, ".metadata": _evil_metadata(marker)})
    (m,) = ka.snapshot(step, run="dcp", step=1)
    assert m.datasets is not None
    assert array_digest("/w", W) in m.datasets
    assert not marker.exists()
    # At verify: the chunk changed, and .metadata is swapped after its hash matched: the
    # tensors are read from the .metadata hashed (the signed one), never the new one.
    shutil.copy(saved / ".metadata", step / ".metadata")
    swap_after_hashing[".metadata"] = _evil_metadata(marker)
    done = run_cli("verify", str(step))
    assert done.exit_code == 1
    assert "dataset /w: content hash" in done.output, done.output
    assert not marker.exists()


def test_a_chunk_file_written_to_after_it_was_hashed_is_refused(
    saved: Path, project: Project, key: SigningKey, swap_after_hashing: dict[str, bytes]
) -> None:
    step = _copy(saved, project.root / "dcp" / "step-1")
    changed = _changed((step / "__0_0.distcp").read_bytes(), W, W * 2)
    swap_after_hashing["in place:__0_0.distcp"] = changed
    os.utime(step / "__0_0.distcp", ns=(0, 0))  # any write from now on moves its mtime
    with pytest.raises(CheckpointError, match="written to while the step was read"):
        ka.snapshot(step, run="dcp", step=1)
    assert not (project.root / "dcp" / "step-1.kaudit.json").exists()
