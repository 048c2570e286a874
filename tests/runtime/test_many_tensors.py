"""A state of hundreds of small tensors of mixed dtypes: the writer places each number array
of 256 bytes or more where it records it, HDF5 writes the smaller ones, and a restore reads
the checkpoint once; it round-trips bitwise, verifies, and a changed tensor is named, placed
or not."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint import opened as opened_module
from kronos_audit.checkpoint.hashing import array_digest
from kronos_audit.errors import CheckpointSkipped
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import read_manifest

DTYPES = ("<f8", "<f4", "<f2", "<i8", "<i4", "|i1", "<u2", "|u1", "|b1", "<c8", ">f8")


def mixed_state() -> dict[str, Any]:
    """About 300 tensors: every dtype, 0-d to 3-d, each smaller or larger than the writer's
    256-byte threshold, an empty one, text."""
    rng = np.random.default_rng(7)
    layers: dict[str, Any] = {}
    for i in range(24):
        layer: dict[str, Any] = {}
        for j, dtype in enumerate(DTYPES):
            shape = [(), (3,), (5, 7), (2, 3, 11), (40,)][(i + j) % 5]
            if dtype.startswith(">") and not shape:
                shape = (3,)  # a 0-d big-endian array comes back little-endian (the codec's)
            values = rng.standard_normal(shape) * 100
            layer[f"t{j}"] = np.asarray(values).astype(dtype)
        layer["step"] = np.int64(1000 + i)
        layers[f"layer{i}"] = layer
    return {"layers": layers, "empty": np.zeros((0, 4), np.float32), "name": "mixed"}


def tensors(state: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out.update(tensors(value, f"{prefix}/{key}"))
        else:
            out[f"{prefix}/{key}"] = value
    return out


def write(root: Path, state: dict[str, Any]) -> Path:
    with ka.Run("many", root=root, seed=1, every=ka.EverySteps(1), asynchronous=False) as run:
        run.checkpoint(1, state)
    return root / "many" / "step-00000001.h5"


def test_hundreds_of_small_tensors_round_trip_bitwise_read_once(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project.root / "checkpoints"
    state = mixed_state()
    path = write(root, state)
    manifest = read_manifest(Path(f"{path}.kaudit.json"))
    signed = {d.path: d for d in manifest.datasets or ()}
    want = tensors(state)
    assert len(want) > 250
    for name, value in want.items():
        if isinstance(value, np.ndarray | np.generic):
            # each tensor's digest is as docs/manifests.md defines it, placed or not
            assert signed[name] == array_digest(name, np.asarray(value)), name
            placed = signed[name].extent is not None
            big = value.nbytes >= 256 and value.dtype.byteorder != ">"
            assert placed == big, name
    # The restore opens the checkpoint once, and reads it whole once.
    opens: list[str] = []
    real_open = opened_module.open_file

    def counted(path: Path | str, **kw: Any) -> opened_module.OpenFile:
        opens.append(Path(path).name)
        return real_open(path, **kw)

    monkeypatch.setattr("kronos_audit.verification.verifier.open_file", counted)
    monkeypatch.setattr("kronos_audit.checkpoint.verified.open_file", counted)
    with ka.Run("many", root=root, seed=1) as run:
        got = run.restore()
    assert opens == [path.name]
    assert got is not None
    restored = tensors(got)
    assert restored.keys() == want.keys()
    for name, value in want.items():
        back = restored[name]
        if isinstance(value, str):
            assert back == value
            continue
        assert type(back) is type(value), name
        assert back.dtype == value.dtype, name
        assert np.shape(back) == np.shape(value), name
        assert np.asarray(back).tobytes() == np.asarray(value).tobytes(), name
        if isinstance(back, np.ndarray) and back.size:
            assert back.flags.writeable, name  # the program may train on it in place
    (result,) = ka.verify(Path(f"{path}.kaudit.json"))
    assert result.ok, result.failures


def flip(path: Path, dataset: str) -> None:
    """Change one byte of ``dataset``'s data in the file itself."""
    with h5py.File(path) as f:
        offset = f[dataset].id.get_offset()
    assert offset is not None
    with open(path, "r+b") as out:
        out.seek(offset)
        byte = out.read(1)
        out.seek(offset)
        out.write(bytes([byte[0] ^ 0x01]))


def test_a_changed_tensor_is_named_placed_or_not(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    state = mixed_state()
    with ka.Run("many", root=root, seed=1, every=ka.EverySteps(1), asynchronous=False) as run:
        run.checkpoint(1, state)
        run.checkpoint(2, state)
    path = root / "many" / "step-00000002.h5"
    manifest = read_manifest(Path(f"{path}.kaudit.json"))
    signed = {d.path: d for d in manifest.datasets or ()}
    numbers = {n: v for n, v in tensors(state).items() if isinstance(v, np.ndarray) and v.size}
    large = next(n for n in numbers if signed[n].extent is not None)
    small = next(n for n, v in numbers.items() if signed[n].extent is None and v.nbytes > 1)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    flip(path, large)
    flip(path, small)
    assert hashlib.sha256(path.read_bytes()).hexdigest() != before
    (result,) = ka.verify(Path(f"{path}.kaudit.json"))
    assert not result.ok
    named = {c.dataset for c in result.failures if c.dataset is not None}
    assert named == {large, small}
    with ka.Run("many", root=root, seed=1) as run:
        with pytest.warns(CheckpointSkipped) as skipped:
            run.restore()
        assert run.step == 1  # the changed step is skipped, the one before taken
    (warning,) = [str(w.message) for w in skipped]
    assert "step-00000002.h5: skipped" in warning
    assert f"dataset {large}" in warning
    assert f"dataset {small}" in warning
