"""Replays and the CPU's floating-point dispatch: a torch training run recorded natively is
NOT REPRODUCED when the replay's kernels differ, and says so in one line naming the
dispatch; the same run recorded portable (`kaudit run --portable`) replays bitwise although
the replaying process's environment asks for other kernels and thread counts. Both are
the one-machine proxy for a replay on another vendor's CPU: the same variables decide.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.replay import SCHEMA_NAME
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.statement.schemas import validate
from tests.helpers import run_cli
from tests.replay.helpers import commit_all, manifest, resign

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")

MLP = '''\
"""A small MLP trained with AdamW: its bits depend on the kernels torch and MKL choose."""
import sys

import torch

import kronos_audit as ka

with ka.Run("mlp", root="checkpoints", seed=11, every=ka.EverySteps(5)) as run:
    torch.manual_seed(11)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = {"model": model, "opt": opt}
    run.restore(like=state)
    x = torch.randn(256, 32, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (256,), generator=torch.Generator().manual_seed(2))
    for step in run.steps(int(sys.argv[1])):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        run.checkpoint(step, state)
'''

PERTURBED = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1"}
"""What the replaying process's environment asks for: other kernels, another thread count."""


def _kaudit(repo: Path, *args: str, cwd: str = "programs") -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kronos_audit", *args],
        cwd=repo / cwd,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def _replay(target: Path, *, exit_code: int) -> dict[str, Any]:
    result = run_cli("replay", str(target), "--json")
    assert result.exit_code == exit_code, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    validate(doc, schema_name=SCHEMA_NAME, what="kaudit replay --json")
    return doc


@pytest.fixture
def mlp(repo: Path) -> Path:
    """The MLP program committed in the replay tests' repository; its run directory."""
    (repo / "programs" / "mlp.py").write_text(MLP)
    commit_all(repo, "mlp")
    return repo / "programs" / "checkpoints" / "mlp"


def _needs_avx2() -> None:
    if str(torch.backends.cpu.get_cpu_capability()) == "DEFAULT":
        pytest.skip("needs a CPU whose torch kernels are vectorised (AVX2 or wider)")


def test_a_native_run_replayed_with_other_kernels_names_the_dispatch(
    mlp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _needs_avx2()
    _kaudit(mlp.parents[2], "run", "--retries", "0", "--", sys.executable, "mlp.py", "10")
    for name, value in PERTURBED.items():
        monkeypatch.setenv(name, value)
    doc = _replay(manifest(mlp, 10), exit_code=1)
    assert doc["outcome"] == "NOT_REPRODUCED"
    env = doc["environment"]
    # judged on what the replayed program ran with: its torch capability and thread
    # count, which the replaying process could not have seen
    assert env["judged_on"] == "program"
    drift = {(d["section"], d["name"]): d for d in env["drift"]}
    assert drift[("variables", "ATEN_CPU_CAPABILITY")]["current"] == "default"
    assert drift[("frameworks", "torch.cpu_capability")]["current"] == "DEFAULT"
    assert drift[("frameworks", "torch.num_threads")]["current"] == "1"
    cause = doc["cause"]
    assert cause.startswith(f"{len([d for d in doc['datasets'] if not d['ok']])} datasets differ")
    assert "the CPU dispatch changed (" in cause
    assert "-> DEFAULT on " in cause
    assert "record with a portable dispatch (kaudit run --portable)" in cause
    assert "the thread counts changed" in cause
    assert cause.endswith("or compare with a tolerance")
    text = run_cli("replay", str(manifest(mlp, 10)))
    assert text.exit_code == 1
    assert "why: " in text.stdout
    assert "the CPU dispatch changed" in text.stdout
    assert "as the replayed program ran" in text.stdout


def test_a_portable_run_replays_bitwise_under_other_kernels(
    mlp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _needs_avx2()
    repo = mlp.parents[2]
    _kaudit(repo, "run", "--portable", "--retries", "0", "--", sys.executable, "mlp.py", "10")
    lock = read_manifest(manifest(mlp, 10)).record.environment.to_json_obj()
    assert lock["cpu"]["dispatch"] == "portable"
    assert lock["variables"]["ATEN_CPU_CAPABILITY"] == "avx2"
    assert lock["frameworks"]["torch"]["cpu_capability"] == "AVX2"
    for name, value in PERTURBED.items():
        monkeypatch.setenv(name, value)
    doc = _replay(manifest(mlp, 10), exit_code=0)
    assert doc["outcome"] == "REPRODUCED"
    assert doc["cause"] is None
    assert doc["environment"]["judged_on"] == "program"
    # the replay gave the command the recorded pins, over the replayer's own variables
    drifted = {d["name"] for d in doc["environment"]["drift"]}
    assert not drifted & {"ATEN_CPU_CAPABILITY", "MKL_CBWR", "OMP_NUM_THREADS"}, drifted
    # and the segment with a parent too
    assert _replay(manifest(mlp, 5), exit_code=0)["outcome"] == "REPRODUCED"


def test_a_recorded_pin_that_is_not_a_plain_setting_is_refused(repo: Path, key: SigningKey) -> None:
    heat = ("run.py", "--steps", "5", "--every", "5", "--n", "8")
    _kaudit(repo, "run", "--portable", "--retries", "0", "--", sys.executable, *heat, cwd="heat")
    target = manifest(repo / "heat" / "checkpoints" / "heat", 5)

    def hostile(predicate: dict[str, Any]) -> None:
        predicate["environment"]["variables"]["XLA_FLAGS"] = "--xla_dump_to=/tmp/x; rm -rf ~"

    resign(target, key, hostile)
    result = run_cli("replay", str(target))
    assert result.exit_code == 2, result.output
    assert "the recorded XLA_FLAGS is not a plain setting" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("leaves", "says"),
    [
        ("", None),  # a program that records no lock: judged on the replaying process
        (
            'mkfifo "$3/.kaudit-environment.json"',
            "program left (.kaudit-environment.json) is a FIFO",
        ),
        (
            'echo "{}" > "$3/.kaudit-environment.json"',
            "program left (.kaudit-environment.json) is not one",
        ),
        (
            'ln -s /etc/passwd "$3/.kaudit-environment.json"',
            "program left (.kaudit-environment.json) is a symbolic link",
        ),
    ],
)
def test_the_lock_a_replayed_program_leaves_is_read_with_care(
    repo: Path, leaves: str, says: str | None
) -> None:
    cwd = repo / "programs"
    (cwd / "leaves.sh").write_text(f'bash solver.sh "$1" "$2" "$3"\n{leaves}\n')
    commit_all(repo, "a solver that leaves a lock of its own")
    out = "checkpoints/leaves"
    subprocess.run(["bash", "solver.sh", "", "5", out], cwd=cwd, check=True)
    made = run_cli(
        "snapshot", f"{out}/step-00000005.h5", "--run", "leaves", "--step", "5",
        "--command", "bash leaves.sh {resume_from} {stop_at} {out}", cwd=cwd,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    target = cwd / out / "step-00000005.h5.kaudit.json"
    if says is None:
        doc = _replay(target, exit_code=0)
        assert doc["environment"]["judged_on"] == "replayer"
        return
    result = run_cli("replay", str(target))
    assert result.exit_code == 2, result.output
    assert says in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output
