"""docs/tutorial.md, done as a newcomer would do it: its program and its Python check run for
real, in a fresh git repository, through the commands the tutorial gives."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scripts.check_doc_code import python_blocks
from tests.helpers import git, run_cli

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial.md"

COMMANDS = (
    "git init -b main",
    "kaudit init",
    "kaudit keys generate --name alice",
    "python walk.py --crash-at 550",
    "python walk.py",
    "python walk.py --run-id walk-uninterrupted",
    "kaudit verify checkpoints/walk",
    "kaudit replay checkpoints/walk/step-00001000.h5.kaudit.json",
)
"""What the tutorial tells the reader to type, in its order, and what this test does."""

INSTALL = (
    "pip install -c kronos-audit/constraints.txt ./kronos-audit",
    "python -m build --wheel kronos-audit",
    "pip install kronos-audit",
)
"""How the tutorial installs kronos-audit: from a clone (what this test's environment is),
from a wheel built there, and from the index once it is published."""


def walk(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "walk.py", *args], cwd=project, capture_output=True, text=True
    )


def result(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return out


def steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:13]) for p in run_dir.glob("step-*.h5.kaudit.json"))


@pytest.mark.slow
def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    text = TUTORIAL.read_text(encoding="utf-8")
    for command in COMMANDS:
        assert f"\n{command}\n" in text, f"the tutorial no longer says {command!r}"
    for command in INSTALL:
        assert f"\n{command}" in text, f"the tutorial no longer says {command!r}"
    assert text.index(INSTALL[0]) < text.index(f"\n{INSTALL[-1]}\n")  # the clone first
    assert (TUTORIAL.parents[1] / "constraints.txt").is_file()  # the file it names
    program, check = python_blocks(TUTORIAL)  # every Python block of the page, each run here

    project = tmp_path / "walk"
    project.mkdir()
    git(project, "init", "-q", "-b", "main")
    assert run_cli("init", cwd=project).exit_code == 0
    assert run_cli("keys", "generate", "--name", "alice", cwd=project).exit_code == 0
    (project / "walk.py").write_text(program.code, encoding="utf-8")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "kaudit init, the walk")

    crashed = walk(project, "--crash-at", "550")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    run_dir = project / "checkpoints" / "walk"
    survived = steps(run_dir)
    assert survived, "no checkpoint reached the disk before the crash"
    assert max(survived) <= 500, survived  # no last checkpoint on a SIGKILL

    resumed = result(walk(project))
    uninterrupted = result(walk(project, "--run-id", "walk-uninterrupted"))
    assert resumed["step"] == 1000
    assert resumed == uninterrupted  # bitwise: the particles and the generator came back
    assert steps(run_dir) == list(range(100, 1001, 100))

    verified = run_cli("verify", "checkpoints/walk", cwd=project)
    assert verified.exit_code == 0, verified.output
    assert "10 manifest(s): 10 ok; data checked for 10" in verified.output
    assert "10 manifest(s): 10 ok; data checked for 10" in text

    replayed = run_cli("replay", "checkpoints/walk/step-00001000.h5.kaudit.json", cwd=project)
    assert replayed.exit_code == 0, replayed.output
    verdict = next(line for line in replayed.output.splitlines() if "REPRODUCED" in line)
    assert verdict.startswith("REPRODUCED: ")
    assert verdict in text  # the datasets the tutorial counts are the ones there are

    (tmp_path / "check.py").write_text(check.code, encoding="utf-8")
    checked = subprocess.run(
        [sys.executable, str(tmp_path / "check.py")], cwd=project, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr
    printed = checked.stdout.splitlines()
    assert printed == ["10 checkpoints verified, the last at step 1000", *printed[1:]]
    for line in printed:
        assert f"\n{line}\n" in text, f"the tutorial does not show {line!r} as printed"
