"""The replay engine's parts: the instruction given to the command, where its output is
found, and the library call's result (frozen, typed, errors with their stage)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from kronos_audit.compare import Verdict
from kronos_audit.errors import Stage
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.replay import Basis, Outcome, ReplayError, replay
from kronos_audit.replay.command import (
    Instruction,
    check_placeholders,
    command_line,
    find_output,
)
from tests.helpers import git
from tests.replay.helpers import manifest, resign, worktrees


def instruction(tmp_path: Path, resume: bool = True, seed: int | None = 7) -> Instruction:
    return Instruction(
        resume_from=tmp_path / "run" / "step-00000010.h5" if resume else None,
        stop_at=20,
        out=tmp_path / "out",
        seed=seed,
    )


def test_placeholders_are_whole_arguments_or_an_options_value(tmp_path: Path) -> None:
    i = instruction(tmp_path)
    argv = command_line(
        ["./solver", "--from={resume_from}", "--to", "{stop_at}", "-o={out}", "{seed}"],
        i,
        repo_root=tmp_path / "repo",
        tree=tmp_path / "tree",
    )
    assert argv == [
        "./solver",
        f"--from={tmp_path}/run/step-00000010.h5",
        "--to",
        "20",
        f"-o={tmp_path}/out",
        "7",
    ]
    none = command_line(["s", "{resume_from}", "--seed={seed}"], instruction(tmp_path, False, None),
                        repo_root=tmp_path, tree=tmp_path)  # fmt: skip
    assert none == ["s", "", "--seed="]
    # Braces that are no placeholder of ours are the program's business.
    assert command_line(["s", "{x}", "--y={z}"], i, repo_root=tmp_path, tree=tmp_path) == [
        "s",
        "{x}",
        "--y={z}",
    ]


@pytest.mark.parametrize(
    "spliced",
    [
        "python solve.py --resume {resume_from}",  # what sh -c would parse
        "{out}/x",
        "--out={out}/x",
        "x{stop_at}",
        "--from={resume_from}{seed}",
        "--{out}={out}",
        "={out}",
        "--a b={out}",
    ],
)
def test_a_placeholder_inside_an_argument_is_refused(tmp_path: Path, spliced: str) -> None:
    with pytest.raises(ReplayError, match="placeholders must be whole arguments") as info:
        command_line(
            ["sh", "-c", spliced],
            instruction(tmp_path),
            repo_root=tmp_path,
            tree=tmp_path,
            manifest=tmp_path / "m.kaudit.json",
        )
    assert info.value.stage == "run"
    assert info.value.exit_code == 2
    assert "argument 2 of the recorded command" in info.value.message
    assert "$KAUDIT_" in info.value.message
    assert info.value.path == tmp_path / "m.kaudit.json"


def test_the_refusal_shows_a_long_or_multi_line_argument_on_one_line(tmp_path: Path) -> None:
    script = "set -e\n" + "echo padding\n" * 40 + "python solve.py {resume_from}\n"
    with pytest.raises(ReplayError) as info:
        check_placeholders(["sh", "-c", script])
    assert "\n" not in info.value.message
    assert len(info.value.message) < 500


def test_python_is_this_interpreter_and_repository_paths_move_into_the_worktree(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    argv = command_line(
        ["python", str(repo / "heat" / "run.py"), "--root", "/data/elsewhere"],
        instruction(tmp_path),
        repo_root=repo,
        tree=tmp_path / "tree",
    )
    assert argv == [
        sys.executable,
        str(tmp_path / "tree" / "heat" / "run.py"),
        "--root",
        "/data/elsewhere",
    ]
    assert command_line(["python3", "-V"], instruction(tmp_path), repo_root=repo, tree=repo)[0] == (
        sys.executable
    )


def test_the_instruction_in_the_environment(tmp_path: Path) -> None:
    base = {"PATH": "/bin", "KAUDIT_PROGRESS": "/x", "KAUDIT_SEED": "1"}
    env = instruction(tmp_path).environ(base)
    assert env["KAUDIT_RESUME_FROM"] == str(tmp_path / "run" / "step-00000010.h5")
    assert env["KAUDIT_STOP_AT"] == "20"
    assert env["KAUDIT_OUT"] == str(tmp_path / "out")
    assert env["KAUDIT_SEED"] == "7"
    assert "KAUDIT_PROGRESS" not in env
    assert env["PATH"] == "/bin"
    fresh = instruction(tmp_path, resume=False, seed=None).environ(base)
    assert fresh["KAUDIT_RESUME_FROM"] == ""
    assert "KAUDIT_SEED" not in fresh


def test_find_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ReplayError, match="wrote no checkpoint") as info:
        find_output(out, 20)
    assert info.value.stage == "output"
    (out / ".partial").write_text("ignored")
    (out / "result.h5").write_text("x")
    assert find_output(out, 20) == out / "result.h5"
    (out / "step-00000020.h5").write_text("x")
    assert find_output(out, 20) == out / "step-00000020.h5"  # the expected name wins
    (out / "step-00000020.h5").unlink()
    (out / "other.h5").write_text("x")
    with pytest.raises(ReplayError, match="2 files"):
        find_output(out, 20)
    (out / "other.h5").unlink()
    (out / "result.h5").rename(out / "step-00000012.h5")
    with pytest.raises(ReplayError, match="stopped at step 12, not at step 20"):
        find_output(out, 20)


@pytest.mark.slow
def test_the_library_returns_a_frozen_result(heat: Path) -> None:
    result = replay(manifest(heat, 20))
    assert result.outcome is Outcome.REPRODUCED
    assert result.basis is Basis.HASHES
    assert result.to_json_obj()["basis"] == "hashes"
    assert result.ok
    assert result.get("fields/u").verdict is Verdict.IDENTICAL
    # fields/u, time, iterations, /kaudit/tree and the three generators in /rng
    assert result.counts()[Verdict.IDENTICAL] == 7
    assert result.failures == ()
    assert result.parent is not None
    assert result.parent.step == 10
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.commit = "x"  # type: ignore[misc]
    not_hdf5 = dataclasses.replace(result, datasets=(), file_identical=False)
    assert not_hdf5.outcome is Outcome.NOT_REPRODUCED  # then the file digest decides
    assert 0 < result.timings.command < result.timings.total


@pytest.mark.slow
def test_errors_carry_their_stage(heat: Path, key: SigningKey, repo: Path) -> None:
    def failing(p: dict[str, Any]) -> None:
        p["command"] = ["python", "-c", "raise SystemExit(4)"]

    target = resign(manifest(heat, 20), key, failing)
    with pytest.raises(ReplayError) as info:
        replay(target, keep_workdir=True)
    assert info.value.stage == "run"
    assert info.value.stage is Stage.RUN
    assert info.value.exit_code == 2
    assert "work directory kept: " in info.value.message
    kept = Path(info.value.message.rsplit("work directory kept: ", 1)[1].rstrip(")"))
    assert (kept / "stderr.log").exists()
    assert str(kept / "src") in worktrees(repo)
    git(repo, "worktree", "remove", "--force", str(kept / "src"))
