"""Directory steps of real tools' formats: a torch DCP save (its tensors by global name,
across files, and its dot-file signed) and a Hugging Face-like directory (per-tensor
digests of the safetensors file inside it)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.formats import Format
from kronos_audit.checkpoint.hashing import array_digest
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.helpers import run_cli


@pytest.mark.slow  # torch's import: seconds of its own
def test_a_torch_dcp_save_is_one_step_with_its_tensors(project: Project, key: SigningKey) -> None:
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    step = project.root / "dcp" / "step-10"
    w = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    with warnings.catch_warnings():  # "assuming ... a single process": it is one
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"w": w, "b": torch.ones(4)}, checkpoint_id=str(step))
    before = sorted(p.name for p in step.iterdir())
    (m,) = ka.snapshot(step, run="dcp", step=10)
    assert sorted(p.name for p in step.iterdir()) == before  # nothing written inside
    record = m.record.directory
    assert record is not None
    assert ".metadata" in [f.path for f in record.files]
    # The tensors span the files: recorded for the directory, by global name.
    assert m.record.format == Format.DCP
    assert m.datasets is not None
    by_name = {d.path: d for d in m.datasets}
    assert by_name["/w"] == array_digest("/w", w.numpy())
    assert run_cli("verify", str(step)).exit_code == 0
    # Saved again, equal: diff compares tensors, not DCP's bytes (its ids differ).
    again = project.root / "dcp" / "step-20"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"w": w, "b": torch.ones(4) * 2}, checkpoint_id=str(again))
    ka.snapshot(again, run="dcp", step=20, parent=m.path)
    diff = run_cli("diff", str(step), str(again))
    assert diff.exit_code == 1, diff.output
    assert "/b" in diff.output
    assert ".metadata" not in diff.output
    # DCP's own metadata changed: verify names the dot-file.
    data = bytearray((step / ".metadata").read_bytes())
    (step / ".metadata").unlink()
    data[-3] ^= 1
    (step / ".metadata").write_bytes(bytes(data))
    done = run_cli("verify", str(step))
    assert done.exit_code == 1
    assert "files: changed: .metadata" in done.output


def test_a_safetensors_file_inside_a_step_gets_its_tensors(
    project: Project, key: SigningKey
) -> None:
    st = pytest.importorskip("safetensors.numpy")
    step = project.root / "hf" / "checkpoint-500"
    step.mkdir(parents=True)
    weight = np.arange(6, dtype=np.float32).reshape(2, 3)
    st.save_file({"layer.weight": weight}, str(step / "model.safetensors"))
    (step / "config.json").write_text('{"hidden": 3}\n')
    (m,) = ka.snapshot(step, run="hf", step=500)
    assert m.record.directory is not None
    files = {f.path: f for f in m.record.directory.files}
    assert files["config.json"].datasets is None
    tensors = files["model.safetensors"].datasets
    assert tensors is not None
    assert list(tensors) == [array_digest("/layer.weight", weight)]
    # Another step with one tensor changed: diff names the tensor inside the file.
    other = project.root / "hf" / "checkpoint-600"
    other.mkdir()
    st.save_file({"layer.weight": weight + 1}, str(other / "model.safetensors"))
    (other / "config.json").write_text('{"hidden": 3}\n')
    ka.snapshot(other, run="hf", step=600, parent=m.path)
    diff = run_cli("diff", str(step), str(other))
    assert diff.exit_code == 1, diff.output
    assert "model.safetensors/layer.weight" in diff.output
    assert "DIFFERENT" in diff.output
