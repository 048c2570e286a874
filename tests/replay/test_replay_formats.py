"""Replay of checkpoints other tools write: safetensors, npz and npy judged tensor by
tensor as HDF5 datasets are (bitwise by digests, within a tolerance by values, across
formats), and torch.save pickles judged by their tensors after a verified weights-only
load when their bytes differ, by their bytes alone (saying so) without torch."""

from __future__ import annotations

import io
import json
import os
import pickle
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from kronos_audit.checkpoint.formats import digest_file
from kronos_audit.cli.commands.replay import render
from kronos_audit.compare import TolerancePolicy, Verdict
from kronos_audit.errors import CheckpointError, ReplayError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.replay import (
    SCHEMA_NAME,
    Basis,
    attestation_path_for,
    replay,
    write_attestation,
)
from kronos_audit.replay.comparison import compare_file
from kronos_audit.replay.interface import ComparedBy
from kronos_audit.replay.pickled import compare_pickle
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.manifest import Manifest
from kronos_audit.statement.schemas import validate
from tests.helpers import run_cli
from tests.replay import recorded
from tests.replay.helpers import commit_all

key = recorded.key
repo = recorded.repo
project = recorded.project

U = np.linspace(0.0, 1.0, 12) ** 3
EXACT = TolerancePolicy()


def signed(path: Path, key: SigningKey) -> Manifest:
    (m,) = snapshot(path, run="r", step=1, key=key)
    return m


def compared(m: Manifest, produced: Path, policy: TolerancePolicy = EXACT) -> Any:
    basis = Basis.for_policy(policy)
    digests = digest_file(produced)
    if m.record.format == "pickle":
        return compare_pickle(m, produced, digests, policy, basis)
    return compare_file(m, produced, digests, policy, basis)


def verdicts(c: Any) -> dict[str, Verdict]:
    return {d.path: d.verdict for d in c.datasets}


# -- safetensors, npz, npy: tensor by tensor, as HDF5 datasets -------------------------------


def test_a_safetensors_checkpoint_is_judged_tensor_by_tensor(
    repo: Path, key: SigningKey, tmp_path: Path
) -> None:
    recorded_file = repo / "rec" / "model.safetensors"
    recorded_file.parent.mkdir()
    save_file({"u": U, "step": np.array(5)}, str(recorded_file))
    m = signed(recorded_file, key)
    assert m.record.format == "safetensors"
    same = tmp_path / "same.safetensors"
    save_file({"step": np.array(5), "u": U.copy()}, str(same), metadata={"by": "replay"})
    c = compared(m, same)
    assert c.compared_by is ComparedBy.DATASETS
    assert verdicts(c) == {"/step": Verdict.IDENTICAL, "/u": Verdict.IDENTICAL}
    # The same arrays in an npz: one array, one digest, whatever the format.
    as_npz = tmp_path / "out.npz"
    np.savez(as_npz, u=U, step=np.array(5))
    c = compared(m, as_npz)
    assert set(verdicts(c).values()) == {Verdict.IDENTICAL}
    assert c.notes == ("compared across formats: recorded safetensors, produced npz",)
    # One value changed: bitwise, that tensor and no other, and where and by how much.
    changed = tmp_path / "changed.safetensors"
    v = U.copy()
    v[3] += 1e-12
    save_file({"u": v, "step": np.array(5)}, str(changed))
    c = compared(m, changed)
    assert verdicts(c) == {"/step": Verdict.IDENTICAL, "/u": Verdict.DIFFERENT}
    (u,) = [d for d in c.datasets if d.path == "/u"]
    assert u.comparison is not None
    assert u.comparison.first_mismatch is not None
    assert u.comparison.first_mismatch.index == (3,)
    # Within a tolerance, by the values (the recorded ones read as the signed bytes).
    c = compared(m, changed, TolerancePolicy.from_options(atol=1e-9))
    assert verdicts(c) == {"/step": Verdict.IDENTICAL, "/u": Verdict.WITHIN_TOLERANCE}


def test_a_tensor_of_another_shape_or_missing_is_named(
    repo: Path, key: SigningKey, tmp_path: Path
) -> None:
    recorded_file = repo / "rec" / "u.npy"
    recorded_file.parent.mkdir()
    np.save(recorded_file, U)
    m = signed(recorded_file, key)
    reshaped = tmp_path / "u.npy"
    np.save(reshaped, U.reshape(3, 4))
    (d,) = compared(m, reshaped).datasets
    assert (d.path, d.verdict) == ("/u", Verdict.NOT_COMPARABLE)
    assert d.detail == "replayed <f8[3, 4], recorded <f8[12]"
    text = tmp_path / "u.txt"
    text.write_text("not a tensor")
    (d,) = compared(m, text).datasets
    assert d.verdict is Verdict.ONLY_IN_A
    assert d.detail == "the replay's output has no tensors kaudit reads (a bytes file)"


# -- pickles: by their tensors after a verified weights-only load ------------------------------


def save_pt(path: Path, w: torch.Tensor, dirpath: str) -> Path:
    """A Lightning-like checkpoint: weights, a step, and a path a callback kept."""
    torch.save(
        {
            "state_dict": {"w": w, "b": torch.ones(3, dtype=torch.bfloat16)},
            "global_step": 7,
            "callbacks": {"ModelCheckpoint": {"dirpath": dirpath}},
        },
        path,
    )
    return path


W = torch.arange(6.0).reshape(2, 3)


@pytest.fixture
def pt(repo: Path, key: SigningKey) -> Manifest:
    """A signed ``.pt`` whose callback kept the path it was written to."""
    path = repo / "rec" / "last.pt"
    path.parent.mkdir()
    return signed(save_pt(path, W, str(path.parent)), key)


def test_a_pickle_whose_bytes_differ_is_judged_by_its_tensors(pt: Manifest, tmp_path: Path) -> None:
    assert pt.record.format == "pickle"
    produced = save_pt(tmp_path / "last.pt", W.clone(), str(tmp_path))
    assert digest_file(produced).sha256 != pt.subject_sha256  # the path it keeps differs
    c = compared(pt, produced)
    assert c.compared_by is ComparedBy.TENSORS
    assert verdicts(c) == {
        "/global_step": Verdict.IDENTICAL,
        "/state_dict/b": Verdict.IDENTICAL,
        "/state_dict/w": Verdict.IDENTICAL,
    }
    assert "its 3 tensors were compared" in c.notes[0]
    assert "weights-only torch.load" in c.notes[0]
    assert c.uncompared == (
        "1 value of the pickle that is neither tensors nor numbers (strings, None, ...): "
        "/callbacks/ModelCheckpoint/dirpath",
    )
    # A weight changed: that tensor, by name, where and by how much.
    nudged = W.clone()
    nudged[1, 2] += 0.5
    c = compared(pt, save_pt(tmp_path / "nudged.pt", nudged, str(tmp_path)))
    assert verdicts(c)["/state_dict/w"] is Verdict.DIFFERENT
    (w,) = [d for d in c.datasets if not d.ok]
    assert w.comparison is not None
    assert w.comparison.max_abs_error == 0.5
    # Within a tolerance, by the values.
    c = compared(pt, tmp_path / "nudged.pt", TolerancePolicy.from_options(atol=1.0))
    assert verdicts(c)["/state_dict/w"] is Verdict.WITHIN_TOLERANCE
    # The same bytes: the file digest decides, nothing loaded.
    same = tmp_path / "same.pt"
    same.write_bytes(pt.checkpoint_path.read_bytes())
    c = compared(pt, same)
    assert (c.compared_by, c.datasets) == (ComparedBy.FILE, ())


def test_only_the_signed_bytes_of_a_recorded_pickle_are_loaded(
    pt: Manifest, tmp_path: Path
) -> None:
    produced = save_pt(tmp_path / "last.pt", W, str(tmp_path))
    # The recorded file swapped for the produced one after it was verified (it would
    # compare equal): refused before torch reads a byte of it.
    os.replace(save_pt(tmp_path / "swap.pt", W, str(tmp_path)), pt.checkpoint_path)
    with pytest.raises(CheckpointError, match="changed after it was verified"):
        compared(pt, produced)


class _System:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch pwned",))


def test_a_pickle_torch_refuses_is_judged_by_its_bytes_saying_why(
    pt: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    hostile = tmp_path / "last.pt"
    hostile.write_bytes(pickle.dumps({"w": _System()}, protocol=2))
    c = compared(pt, hostile)
    assert (c.compared_by, c.datasets) == (ComparedBy.FILE, ())
    assert "torch's weights-only load refuses it (Trying to load unsupported GLOBAL" in c.notes[0]
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(ReplayError, match="a tolerance cannot be applied"):
        compared(pt, hostile, TolerancePolicy.from_options(atol=1.0))


def test_without_torch_a_pickle_is_compared_by_its_bytes_and_says_so(
    pt: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    produced = save_pt(tmp_path / "last.pt", W, str(tmp_path))
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails, as uninstalled
    c = compared(pt, produced)
    assert (c.compared_by, c.datasets) == (ComparedBy.FILE, ())
    assert c.notes == (
        "a pickle: without torch installed a pickle can only be compared by its bytes, and "
        "they differ (install torch to compare its tensors after a weights-only load)",
    )
    with pytest.raises(ReplayError, match="only be compared by its bytes"):
        compared(pt, produced, TolerancePolicy.from_options(atol=1.0))


# -- whole replays of real programs ----------------------------------------------------------

DIFFUSE = '''\
"""Diffuses u from RESUME (a safetensors file, or nothing) to step STOP, into OUT."""
import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

resume, stop, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if resume:
    t = load_file(resume)
    u, start = t["u"], int(t["step"])
else:
    u, start = np.linspace(0.0, 1.0, 16) ** 3, 0
for _ in range(start, stop):
    u = 0.25 * np.roll(u, 1) + 0.5 * u + 0.25 * np.roll(u, -1)
u = u + float(os.environ.get("KAUDIT_TEST_NUDGE", "0"))
os.makedirs(out, exist_ok=True)
save_file({"u": u, "step": np.array(stop)}, os.path.join(out, f"step-{stop:08d}.safetensors"))
'''

TRAIN_PT = '''\
"""Writes a torch.save checkpoint of step STOP into OUT, keeping OUT in it (as Lightning's
ModelCheckpoint keeps its dirpath)."""
import os
import sys

import torch

stop, out = int(sys.argv[1]), sys.argv[2]
g = torch.Generator().manual_seed(stop)
os.makedirs(out, exist_ok=True)
torch.save(
    {"model": {"w": torch.rand(4, 3, generator=g)}, "step": stop, "dirpath": os.path.abspath(out)},
    os.path.join(out, "last.pt"),
)
'''


def replay_doc(target: Path, *args: str, exit_code: int = 0) -> dict[str, Any]:
    result = run_cli("replay", str(target), *args, "--json")
    assert result.exit_code == exit_code, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    validate(doc, schema_name=SCHEMA_NAME, what="kaudit replay --json")
    return doc


def test_a_safetensors_run_replays_bitwise_and_within_a_tolerance(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    programs = repo / "programs"
    (programs / "diffuse.py").write_text(DIFFUSE)
    commit_all(repo, "diffuse")
    command = "python diffuse.py {resume_from} {stop_at} {out}"
    previous = ""
    for step in (5, 10):
        subprocess.run(
            [sys.executable, "diffuse.py", previous, str(step), "st"], cwd=programs, check=True
        )
        ckpt = f"st/step-{step:08d}.safetensors"
        parent = ["--parent", f"{previous}.kaudit.json"] if previous else []
        made = run_cli(
            "snapshot", ckpt, "--run", "st", "--step", str(step), *parent,
            "--command", command, cwd=programs,
        )  # fmt: skip
        assert made.exit_code == 0, made.output
        previous = ckpt
    target = programs / "st" / "step-00000010.safetensors.kaudit.json"
    shown = run_cli("replay", str(target))
    assert shown.exit_code == 0, shown.output
    assert "resumed from step 5" in shown.stdout
    assert "REPRODUCED: 2 datasets: 2 identical" in shown.stdout
    # The command moved a value: NOT REPRODUCED, naming the tensor; within a tolerance it is.
    monkeypatch.setenv("KAUDIT_TEST_NUDGE", "1e-13")
    doc = replay_doc(target, exit_code=1)
    assert doc["outcome"] == "NOT_REPRODUCED"
    assert {d["path"]: d["verdict"] for d in doc["datasets"]} == {
        "/step": "IDENTICAL",
        "/u": "DIFFERENT",
    }
    doc = replay_doc(target, "--atol", "1e-9")
    assert doc["outcome"] == "REPRODUCED_WITHIN_TOLERANCE"
    assert doc["basis"] == "data"


def test_a_torch_save_run_whose_bytes_differ_reproduces_by_its_tensors(
    repo: Path, key: SigningKey, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    programs = repo / "programs"
    (programs / "train_pt.py").write_text(TRAIN_PT)
    commit_all(repo, "train_pt")
    # Recorded in this process (torch is loaded here already); the replay runs it anew.
    monkeypatch.chdir(programs)
    monkeypatch.setattr(sys, "argv", ["train_pt.py", "3", "pt"])
    runpy.run_path("train_pt.py", run_name="__main__")
    made = run_cli(
        "snapshot", "pt/last.pt", "--run", "pt", "--step", "3",
        "--command", "python train_pt.py {stop_at} {out}", cwd=programs,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    target = programs / "pt" / "last.pt.kaudit.json"
    result = replay(target)  # one replay, shown as `kaudit replay` shows it and as JSON
    render(result, None, target)
    shown = capsys.readouterr().out
    assert "REPRODUCED: 2 tensors: 2 identical  (by tensors, bitwise)" in shown
    assert "its bytes differ from the recorded ones" in shown
    assert "not compared: 1 value of the pickle" in shown
    doc = result.to_json_obj()
    validate(doc, schema_name=SCHEMA_NAME, what="kaudit replay --json")
    assert doc["outcome"] == "REPRODUCED"
    assert doc["produced"]["file_identical"] is False
    assert doc["produced"]["compared_by"] == "tensors"
    assert {d["path"] for d in doc["datasets"]} == {"/model/w", "/step"}
    # Attested, the auditor's report says how it was compared.
    write_attestation(result, key, attestation_path_for(target))
    report = programs / "report.md"
    assert run_cli("report", str(target.parent), "--out", str(report)).exit_code == 0
    text = report.read_text()
    assert "REPRODUCED" in text
    assert "its bytes differ from the recorded ones" in text
    assert "1 checkpoint is a pickle" in text


def test_a_weights_only_load_reads_a_tensor_tree_as_saved() -> None:
    """The loader walks what torch.save wrote: nested dicts, lists and tuples by index."""
    from kronos_audit.checkpoint.formats.pickled import weights_only_tensors

    buf = io.BytesIO()
    torch.save({"opt": [{"lr": 0.1, "betas": (0.9, 0.99)}], "n": None, "big": 2**70}, buf)
    got = weights_only_tensors(buf.getvalue(), "x.pt")
    assert sorted(got.tensors) == ["/opt/0/betas/0", "/opt/0/betas/1", "/opt/0/lr"]
    assert got.skipped == ("/big", "/n")
    assert float(got.tensors["/opt/0/lr"].load()) == 0.1
