"""Hostile HDF5 put in place of a signed checkpoint is never parsed before its digest
decides: a 2 KiB file that declares a TiB of unwritten chunks, or a row of 2**45 bytes,
ends `kaudit verify`, `gate`, `report` and `diff` promptly, in one line or a failed check
(exit 1 or 2), never a hang or a traceback. The installed kaudit runs in a subprocess,
under a hang guard."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import h5py
import pytest

from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from tests.helpers import KAUDIT, write_checkpoint
from tests.runtime.test_faults import HANG_GUARD

HOSTILE = {
    "a TiB of unwritten chunks": ((2**40,), (2**20,)),
    "a row of 2**45 bytes": ((1, 2**45), (1, 2**20)),
}


def hostile(path: Path, shape: tuple[int, ...], chunks: tuple[int, ...], pad_to: int = 0) -> Path:
    """A tiny HDF5 file whose /fields/u (a name the signed checkpoint has) declares
    ``shape`` bytes with no data written; padded with zeros to ``pad_to`` bytes (the
    signed size, so that only the digest can tell)."""
    tmp = path.with_name("hostile.tmp")
    with h5py.File(tmp, "w") as f:
        f.create_dataset("fields/u", shape=shape, dtype="u1", chunks=chunks)
        f.create_dataset("fields/v", shape=shape, dtype="u1", chunks=chunks)
    size = tmp.stat().st_size
    assert size < 16 * 1024
    if pad_to > size:
        with open(tmp, "ab") as f:
            f.write(b"\0" * (pad_to - size))
    os.replace(tmp, path)
    return path


def kaudit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KAUDIT, *args], cwd=cwd, capture_output=True, text=True, timeout=HANG_GUARD
    )


def ended_cleanly(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode in (1, 2), done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "MemoryError" not in done.stdout + done.stderr
    assert len(done.stderr.splitlines()) <= 1, done.stderr


@pytest.fixture
def signed(project: Project, key: SigningKey, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(checkpoint, its manifest, the signer's public key file), committed."""
    checkpoint = write_checkpoint(project.root / "checkpoints" / "run1" / "step-00000001.h5", 1)
    (m,) = snapshot(checkpoint, run="run1", step=1, key=key)
    pem = tmp_path / "owner.pem"
    pem.write_bytes(public_pem(key.private_key.public_key()))
    return checkpoint, m.path, pem


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("same_size", [False, True], ids=["tiny", "padded-to-signed-size"])
def test_verify_gate_and_report_end_promptly_on_a_hostile_replacement(
    project: Project, signed: tuple[Path, Path, Path], kind: str, same_size: bool
) -> None:
    checkpoint, manifest, pem = signed
    shape, chunks = HOSTILE[kind]
    hostile(checkpoint, shape, chunks, checkpoint.stat().st_size if same_size else 0)
    done = kaudit("verify", "--trusted-key", str(pem), str(manifest), cwd=project.root)
    ended_cleanly(done)
    assert done.returncode == 1
    assert "file digest" in done.stdout
    # which datasets changed is still said, without reading what they declare
    assert "/fields/u" in done.stdout
    ended_cleanly(kaudit("gate", "--trusted-key", str(pem), cwd=project.root))
    out = project.root.parent / "report.json"
    done = kaudit(
        "report",
        str(checkpoint.parent),
        "--out",
        str(out),
        "--trusted-key",
        str(pem),
        cwd=project.root,
    )
    ended_cleanly(done)
    assert done.returncode == 1


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_diff_of_a_hostile_file_is_one_line(project: Project, tmp_path: Path, kind: str) -> None:
    shape, chunks = HOSTILE[kind]
    good = write_checkpoint(tmp_path / "good.h5")
    bad = hostile(tmp_path / "bad.h5", shape, chunks)
    for a, b in ((good, bad), (bad, good), (bad, bad)):
        done = kaudit("diff", str(a), str(b), cwd=tmp_path)
        ended_cleanly(done)
        assert done.returncode == 2
        assert "declares" in done.stderr, done.stderr
        assert "/fields/u" in done.stderr, done.stderr
