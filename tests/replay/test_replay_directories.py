"""Replay of directory steps: the parent handed over as a verified copy of its directory,
and the directory the command wrote compared file by file, tensor by tensor where digests
exist (a DCP save by global name, whatever its ``.metadata`` bytes)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

import kronos_audit as ka
from kronos_audit.compare import TolerancePolicy, Verdict
from kronos_audit.errors import ReplayError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.replay import SCHEMA_NAME, Basis
from kronos_audit.replay.directory import compare_directory, find_directory_output
from kronos_audit.replay.handover import hand_over
from kronos_audit.statement.manifest import Manifest
from kronos_audit.statement.schemas import validate
from tests.helpers import run_cli
from tests.replay import recorded
from tests.replay.helpers import commit_all

key = recorded.key
repo = recorded.repo

U = np.linspace(0.0, 1.0, 12) ** 3


def write_step(directory: Path, u: np.ndarray[Any, Any], note: bytes = b"v1") -> Path:
    """A tool's step directory: tensors in safetensors and npy, and a plain file."""
    (directory / "extra").mkdir(parents=True)
    save_file({"u": u}, str(directory / "weights.safetensors"))
    np.save(directory / "extra" / "step.npy", np.array(5))
    (directory / ".tool_state").write_bytes(note)
    return directory


def compared(m: Manifest, out: Path, policy: TolerancePolicy | None = None) -> Any:
    policy = policy or TolerancePolicy()
    found = find_directory_output(out, m.checkpoint_path.name)
    return compare_directory(m, found, policy, Basis.for_policy(policy))


@pytest.fixture
def step(repo: Path, key: SigningKey) -> Manifest:
    (m,) = ka.snapshot(write_step(repo / "rec" / "step-5", U), run="d", step=5, key=key)
    return m


def test_a_directory_is_compared_file_by_file_and_tensor_by_tensor(
    step: Manifest, tmp_path: Path
) -> None:
    same = write_step(tmp_path / "a" / "step-5", U.copy())
    c = compared(step, same.parent)
    assert {d.path: d.verdict for d in c.datasets} == {
        "/.tool_state": Verdict.IDENTICAL,
        "/extra/step.npy": Verdict.IDENTICAL,
        "/weights.safetensors": Verdict.IDENTICAL,
    }
    # A tensor moved, a plain file changed, a file added: each named.
    v = U.copy()
    v[2] += 1e-12
    other = write_step(tmp_path / "b" / "anything", v, note=b"v2")
    (other / "new.txt").write_text("x")
    c = compared(step, other.parent)  # the one directory written, whatever its name
    assert {d.path: d.verdict for d in c.datasets} == {
        "/.tool_state": Verdict.DIFFERENT,
        "/extra/step.npy": Verdict.IDENTICAL,
        "/new.txt": Verdict.ONLY_IN_B,
        "/weights.safetensors/u": Verdict.DIFFERENT,
    }
    state = next(d for d in c.datasets if d.path == "/.tool_state")
    assert state.recorded is not None
    assert (state.recorded.dtype, state.recorded.shape) == ("|u1", (2,))  # its bytes
    # Within a tolerance, the tensor is; the plain file's bytes still decide.
    c = compared(step, other.parent, TolerancePolicy.from_options(atol=1e-9))
    verdicts = {d.path: d.verdict for d in c.datasets}
    assert verdicts["/weights.safetensors/u"] is Verdict.WITHIN_TOLERANCE
    assert verdicts["/.tool_state"] is Verdict.DIFFERENT


def test_a_pickle_in_a_directory_is_compared_by_its_tensors(
    repo: Path, key: SigningKey, tmp_path: Path
) -> None:
    import torch

    def save(directory: Path) -> Path:
        """As a Trainer saves: tensors in one pickle, its arguments (a class) in another."""
        directory.mkdir(parents=True)
        w = torch.arange(4.0)
        torch.save({"w": w, "output_dir": str(directory)}, directory / "optimizer.pt")
        torch.save(argparse.Namespace(output_dir=str(directory)), directory / "training_args.bin")
        return directory

    (m,) = ka.snapshot(save(repo / "rec" / "checkpoint-7"), run="hf", step=7, key=key)
    out = save(tmp_path / "out" / "checkpoint-7").parent
    for policy in (None, TolerancePolicy.from_options(atol=1.0)):
        c = compared(m, out, policy)
        assert {d.path: d.verdict for d in c.datasets} == {
            "/optimizer.pt/w": Verdict.IDENTICAL,
            "/training_args.bin": Verdict.DIFFERENT,  # a class torch's loader refuses
        }
        assert c.notes[0].startswith("optimizer.pt: a pickle: its bytes differ")
        assert c.notes[1].startswith("training_args.bin: a pickle: its bytes differ and")
        assert "weights-only load refuses it" in c.notes[1]
        assert c.uncompared[0].endswith(": /output_dir")


@pytest.mark.slow  # torch's DCP, imported for two saves: some 5 s
def test_a_dcp_save_is_compared_by_global_name_bitwise_and_by_values(
    repo: Path, key: SigningKey, tmp_path: Path
) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    def save(w: torch.Tensor, where: Path) -> None:
        with warnings.catch_warnings():  # "assuming ... a single process": it is one
            warnings.simplefilter("ignore", UserWarning)
            dcp.save({"w": w, "step": 3}, checkpoint_id=where, no_dist=True)  # type: ignore[attr-defined]

    w = torch.arange(12.0).reshape(3, 4)
    save(w, repo / "rec" / "step-3")
    (m,) = ka.snapshot(repo / "rec" / "step-3", run="dcp", step=3, key=key)
    nudged = w.clone()
    nudged[2, 1] += 1e-6
    save(nudged, tmp_path / "out" / "step-3")
    c = compared(m, tmp_path / "out")
    assert {d.path: d.verdict for d in c.datasets} == {
        "/step": Verdict.IDENTICAL,
        "/w": Verdict.DIFFERENT,
    }
    (bad,) = [d for d in c.datasets if not d.ok]
    assert bad.comparison is not None  # where and by how much, from the signed files
    assert bad.comparison.first_mismatch is not None
    assert bad.comparison.first_mismatch.index == (2, 1)
    c = compared(m, tmp_path / "out", TolerancePolicy.from_options(atol=1e-5))
    assert {d.path: d.verdict for d in c.datasets}["/w"] is Verdict.WITHIN_TOLERANCE
    # A recorded chunk file changed after it was signed is never read for the values.
    distcp = next(m.checkpoint_path.glob("*.distcp"))
    data = bytearray(distcp.read_bytes())
    data[-1] ^= 1
    distcp.write_bytes(bytes(data))
    with pytest.raises(ReplayError, match="changed after it was verified"):
        compared(m, tmp_path / "out", TolerancePolicy.from_options(atol=1e-5))
    # The replay wrote no DCP save: every recorded tensor is missing from it.
    write_step(tmp_path / "other" / "step-3", U)
    verdicts = {d.path: d.verdict for d in compared(m, tmp_path / "other").datasets}
    assert verdicts["/w"] is Verdict.ONLY_IN_A
    assert verdicts["/.metadata"] is Verdict.ONLY_IN_A


def test_the_step_written_must_be_one_directory(step: Manifest, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ReplayError, match="wrote no directory"):
        compared(step, out)
    write_step(out / "x", U)
    write_step(out / "y", U)
    with pytest.raises(ReplayError, match="wrote 2 directories and no step-5/"):
        compared(step, out)
    (out / "step-5").mkdir()
    (out / "step-5" / "loop").symlink_to("/etc/passwd")
    with pytest.raises(ReplayError, match="is a symbolic link"):
        compared(step, out)


def test_the_parent_directory_is_handed_over_as_a_verified_copy(
    step: Manifest, tmp_path: Path
) -> None:
    copy = hand_over(step, tmp_path / "parent")
    assert copy == tmp_path / "parent" / "step-5"
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()) == [
        ".tool_state",
        "extra/step.npy",
        "weights.safetensors",
    ]
    assert (tmp_path / "parent" / "step-5.kaudit.json").read_bytes() == step.path.read_bytes()
    # A file changed after the parent verified: refused, nothing run from it.
    (step.checkpoint_path / ".tool_state").write_bytes(b"v9")
    with pytest.raises(ReplayError, match=r"\.tool_state of the parent step changed"):
        hand_over(step, tmp_path / "again")


# -- whole replays of real programs ----------------------------------------------------------

DIRSAVE = '''\
"""Diffuses u from RESUME (a step directory, or nothing) to step STOP; writes OUT/step-STOP/."""
import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

resume, stop, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if resume:
    u, start = load_file(os.path.join(resume, "weights.safetensors"))["u"], int(
        np.load(os.path.join(resume, "extra", "step.npy"))
    )
else:
    u, start = np.linspace(0.0, 1.0, 16) ** 3, 0
for _ in range(start, stop):
    u = 0.25 * np.roll(u, 1) + 0.5 * u + 0.25 * np.roll(u, -1)
step = os.path.join(out, f"step-{stop}")
os.makedirs(os.path.join(step, "extra"))
save_file({"u": u}, os.path.join(step, "weights.safetensors"))
np.save(os.path.join(step, "extra", "step.npy"), np.array(stop))
'''

DCPSAVE = '''\
"""A torch DCP save of step STOP into OUT/step-STOP/ (its .metadata differs every save)."""
import sys

import torch
import torch.distributed.checkpoint as dcp

stop, out = int(sys.argv[1]), sys.argv[2]
g = torch.Generator().manual_seed(stop)
dcp.save({"w": torch.rand(4, 3, generator=g), "step": stop}, checkpoint_id=f"{out}/step-{stop}")
'''


def replay_doc(target: Path, *args: str, exit_code: int = 0) -> dict[str, Any]:
    result = run_cli("replay", str(target), *args, "--json")
    assert result.exit_code == exit_code, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    validate(doc, schema_name=SCHEMA_NAME, what="kaudit replay --json")
    return doc


def test_a_run_of_directory_steps_replays_from_its_parent_directory(repo: Path) -> None:
    programs = repo / "programs"
    (programs / "dirsave.py").write_text(DIRSAVE)
    commit_all(repo, "dirsave")
    command = "python dirsave.py {resume_from} {stop_at} {out}"
    previous = ""
    for n in (5, 10):
        subprocess.run(
            [sys.executable, "dirsave.py", previous, str(n), "ds"], cwd=programs, check=True
        )
        parent = ["--parent", f"{previous}.kaudit.json"] if previous else []
        made = run_cli(
            "snapshot", f"ds/step-{n}", "--run", "ds", "--step", str(n), *parent,
            "--command", command, cwd=programs,
        )  # fmt: skip
        assert made.exit_code == 0, made.output
        previous = f"ds/step-{n}"
    target = programs / "ds" / "step-10.kaudit.json"
    doc = replay_doc(target)
    handed = Path(doc["command"]["executed"][2])
    assert (handed.parent.name, handed.name) == ("parent", "step-5")  # a copy, a directory
    assert doc["outcome"] == "REPRODUCED"
    assert {d["path"]: d["verdict"] for d in doc["datasets"]} == {
        "/extra/step.npy": "IDENTICAL",
        "/weights.safetensors": "IDENTICAL",
    }


@pytest.mark.slow  # torch and its DCP, imported by the program and by its replay
def test_a_dcp_save_replays_by_its_tensors_not_its_metadata_bytes(repo: Path) -> None:
    programs = repo / "programs"
    (programs / "dcpsave.py").write_text(DCPSAVE)
    commit_all(repo, "dcpsave")
    subprocess.run([sys.executable, "dcpsave.py", "3", "dcp"], cwd=programs, check=True)
    made = run_cli(
        "snapshot", "dcp/step-3", "--run", "dcp", "--step", "3",
        "--command", "python dcpsave.py {stop_at} {out}", cwd=programs,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    doc = replay_doc(programs / "dcp" / "step-3.kaudit.json")
    assert doc["outcome"] == "REPRODUCED"
    assert doc["produced"]["file_identical"] is False  # .metadata holds a save's own id
    assert {d["path"]: d["verdict"] for d in doc["datasets"]} == {
        "/step": "IDENTICAL",
        "/w": "IDENTICAL",
    }
    assert any("by global name" in n for n in doc["notes"])
