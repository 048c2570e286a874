"""Verify and diff of a directory step name the tensor inside a file: a changed
safetensors, npz or HDF5 file is read again as its signed format says, and a tolerance
compares every file's tensors by value; a ``.metadata`` that is not DCP's is a plain file."""

from __future__ import annotations

import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.helpers import run_cli

W = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.array([0.5, 1.5], dtype=np.float64)


def _step(directory: Path, w: np.ndarray, b: np.ndarray) -> Path:
    st = pytest.importorskip("safetensors.numpy")
    directory.mkdir(parents=True)
    st.save_file({"layer.weight": w, "layer.bias": b}, str(directory / "model.safetensors"))
    np.savez(directory / "optim.npz", m=b * 2)
    with h5py.File(directory / "state.h5", "w") as f:
        f["u"] = w.astype(np.float64)
    (directory / "config.json").write_text('{"hidden": 3}\n')
    return directory


def _rewrite(path: Path, old: np.ndarray, new: np.ndarray) -> None:
    """Replace ``old``'s bytes in ``path`` by ``new``'s (same size): a tensor changed."""
    data = path.read_bytes()
    assert data.count(old.tobytes()) == 1
    path.unlink()  # DVC's cache holds the signed bytes under this inode
    path.write_bytes(data.replace(old.tobytes(), new.tobytes()))


def files_size(m: ka.Manifest, name: str) -> int:
    assert m.record.directory is not None
    return next(f.size for f in m.record.directory.files if f.path == name)


def test_verify_names_each_tensor_of_a_changed_file(project: Project, key: SigningKey) -> None:
    step = _step(project.root / "hf" / "checkpoint-1", W, B)
    (m,) = ka.snapshot(step, run="hf", step=1)
    assert m.record.directory is not None
    formats = {f.path: f.format for f in m.record.directory.files}
    assert formats == {
        "config.json": "bytes",
        "model.safetensors": "safetensors",
        "optim.npz": "npz",
        "state.h5": "hdf5",
    }
    _rewrite(step / "model.safetensors", B, B + 1)
    done = run_cli("verify", str(step))
    assert done.exit_code == 1, done.output
    assert "files: changed: model.safetensors" in done.output
    assert "dataset model.safetensors/layer.bias: content hash" in done.output
    assert "layer.weight" not in done.output  # the tensor that is the same is not named
    # A file that no longer parses as its signed format: verify says why, naming it.
    (step / "optim.npz").unlink()
    (step / "optim.npz").write_bytes(b"\0" * files_size(m, "optim.npz"))
    done = run_cli("verify", str(step))
    assert done.exit_code == 1
    assert "optim.npz: its tensors cannot be read: " in done.output, done.output
    assert "dataset model.safetensors/layer.bias" in done.output


def test_diff_at_a_tolerance_compares_every_files_tensors_by_value(
    project: Project, key: SigningKey
) -> None:
    a = _step(project.root / "hf" / "checkpoint-1", W, B)
    b = _step(project.root / "hf" / "checkpoint-2", W * (1 + 1e-7), B)
    (ma,) = ka.snapshot(a, run="hf", step=1)
    ka.snapshot(b, run="hf", step=2, parent=ma.path)
    within = run_cli("diff", str(a), str(b), "--rtol", "1e-5")
    assert within.exit_code == 0, within.output
    outside = run_cli("diff", str(a), str(b), "--rtol", "1e-9")
    assert outside.exit_code == 1, outside.output
    assert "model.safetensors/layer.weight" in outside.output
    assert "state.h5/u" in outside.output  # HDF5 inside a step: by value too
    # What is compared is what was signed: a file changed since is refused, not compared.
    _rewrite(b / "model.safetensors", B, B + 1)
    changed = run_cli("diff", str(a), str(b), "--rtol", "1e-5")
    assert changed.exit_code == 2, changed.output
    assert "model.safetensors" in changed.stderr
    assert "differs from the signed" in changed.stderr


def test_a_metadata_file_that_is_not_dcps_is_a_plain_file(
    project: Project, key: SigningKey
) -> None:
    step = project.root / "tool" / "step-3"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(pickle.dumps({"epoch": 3}))  # a pickle, not DCP's
    (step / "__0_0.distcp").write_bytes(b"not a chunk")
    (m,) = ka.snapshot(step, run="tool", step=3)
    assert m.record.format is None
    assert m.datasets is None
    assert m.record.directory is not None
    files = {f.path: f for f in m.record.directory.files}
    assert files[".metadata"].format == "pickle"
    assert run_cli("verify", str(step)).exit_code == 0
    # Text called .metadata (another tool's) beside no .distcp file: plain files too.
    other = project.root / "tool" / "step-4"
    other.mkdir()
    (other / ".metadata").write_text("created by another tool\n")
    (n,) = ka.snapshot(other, run="tool", step=4, parent=m.path)
    assert n.record.format is None
