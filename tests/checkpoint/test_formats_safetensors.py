"""safetensors files read from their own header (kronos_audit.checkpoint.formats.safetensors):
files the reference implementation writes, digested tensor by tensor as HDF5 would digest
the same arrays; hostile headers refused; snapshot, verify and diff through them."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

from kronos_audit.checkpoint.formats import Format, digest_file, tensors_of_file
from kronos_audit.checkpoint.hashing import array_digest
from kronos_audit.errors import CheckpointError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.verification.batch import verify
from tests.helpers import assert_bad_input, run_cli

ARRAYS: dict[str, np.ndarray[Any, Any]] = {
    "layer.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
    "layer.bias": np.array([1, -2, 3], dtype=np.int64),
    "mask": np.array([True, False]),
    "empty": np.zeros((0, 3), dtype=np.float64),
}


def _write(path: Path, arrays: dict[str, np.ndarray[Any, Any]] | None = None) -> Path:
    safetensors.numpy.save_file(arrays or ARRAYS, str(path))
    return path


def _raw(path: Path, header: object, data: bytes = b"") -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def test_every_tensor_has_the_digest_of_the_same_array_in_hdf5(tmp_path: Path) -> None:
    fmt, digests = tensors_of_file(_write(tmp_path / "m.safetensors"))
    assert fmt is Format.SAFETENSORS
    assert digests == tuple(
        sorted((array_digest("/" + k, v) for k, v in ARRAYS.items()), key=lambda d: d.path)
    )
    with h5py.File(tmp_path / "m.h5", "w") as f:
        for k, v in ARRAYS.items():
            f[k] = v
    assert {d.path: d for d in tensors_of_file(tmp_path / "m.h5")[1] or ()} == {
        d.path: d for d in digests
    }


def test_bfloat16_and_float8_written_by_torch_get_canonical_names(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    w = torch.tensor([1.5, -2.0, 3.25])
    safetensors.torch.save_file(
        {
            "bf": w.to(torch.bfloat16),
            "f8": w.to(torch.float8_e4m3fn),
            "f5": w.to(torch.float8_e5m2),
        },
        str(path),
    )
    named = {d.path: d.dtype for d in tensors_of_file(path)[1] or ()}
    assert named == {"/bf": "bfloat16", "/f8": "float8_e4m3fn", "/f5": "float8_e5m2"}
    # and they are compared as their float values
    result = run_cli("diff", str(path), str(path))
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("build", "mention"),
    [
        (lambda p: p.write_bytes(struct.pack("<Q", 2**40) + b"{}"), "refused"),
        (lambda p: p.write_bytes(struct.pack("<Q", 1000) + b"{}"), "past the end"),
        (
            lambda p: _raw(
                p, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4
            ),
            "outside the data section",
        ),
        (
            lambda p: _raw(
                p,
                {
                    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
                },
                b"\0" * 12,
            ),
            "overlaps",
        ),
        (
            lambda p: _raw(
                p, {"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8
            ),
            "no tensor holds",
        ),
        (
            lambda p: _raw(
                p, {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8
            ),
            "take 12",
        ),
        (
            lambda p: _raw(
                p, {"a": {"dtype": "OBJ", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8
            ),
            "not one kaudit reads",
        ),
        (lambda p: p.write_bytes(struct.pack("<Q", 9) + b'{"a":1,"a'), "bad safetensors header"),
    ],
)
def test_hostile_headers_are_refused_naming_what_is_wrong(
    tmp_path: Path, build: object, mention: str
) -> None:
    path = tmp_path / "bad.safetensors"
    build(path)  # type: ignore[operator]
    with pytest.raises(CheckpointError) as err:
        tensors_of_file(path)
    assert mention in err.value.message
    assert_bad_input(run_cli("diff", str(path), str(path)), "bad.safetensors", mention)


def test_snapshot_records_tensors_and_verify_names_the_changed_one(
    project: Project, key: SigningKey
) -> None:
    path = _write(project.root / "model.safetensors")
    (m,) = snapshot(path, run="r", step=0)
    assert m.record.format == "safetensors"
    assert [d.path for d in m.datasets or ()] == ["/empty", "/layer.bias", "/layer.weight", "/mask"]
    ((result,),) = [verify(m.path)]
    assert result.ok
    changed = dict(ARRAYS, **{"layer.bias": np.array([1, -2, 4], dtype=np.int64)})
    path.unlink()  # DVC's cache keeps the signed copy
    _write(path, changed)
    (result,) = verify(m.path)
    assert not result.ok
    failed = [c for c in result.checks if not c.ok]
    assert [c.dataset for c in failed if c.dataset] == ["/layer.bias"]
    show = run_cli("show", str(m.path))
    assert "format       safetensors" in show.stdout


def test_diff_compares_tensor_by_tensor_across_formats(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.safetensors")
    np.savez(tmp_path / "b.npz", **ARRAYS)  # type: ignore[arg-type]
    same = run_cli("diff", str(a), str(tmp_path / "b.npz"), "--rtol", "1e-6")
    assert same.exit_code == 0, same.output
    assert "compared across formats: A is safetensors, B is npz" in same.stdout
    near = dict(ARRAYS, **{"layer.weight": ARRAYS["layer.weight"] * np.float32(1 + 1e-7)})
    b = _write(tmp_path / "b.safetensors", near)
    assert run_cli("diff", str(a), str(b), "--rtol", "1e-6").exit_code == 0
    far = dict(ARRAYS, **{"layer.weight": ARRAYS["layer.weight"] + 1})
    c = _write(tmp_path / "c.safetensors", far)
    differ = run_cli("diff", str(a), str(c), "--rtol", "1e-6")
    assert differ.exit_code == 1
    assert "/layer.weight" in differ.stdout


def test_a_pickle_is_marked_and_never_read(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save({"w": torch.ones(2)}, path)
    digests = digest_file(path)
    assert (digests.format, digests.datasets) == ("pickle", None)
    assert_bad_input(run_cli("diff", str(path), str(path)), "model.pt", "never unpickles")
