"""`kaudit push`, `pull`, `status` (kronos_audit.cli.commands) with --json, against a DVC
remote in a local directory."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage import Storage, configure_remote
from tests.helpers import assert_bad_input, discard, run_cli, write_checkpoint
from tests.sshd import unused_port


@pytest.fixture
def run_dir(project: Project, key: SigningKey, tmp_path: Path) -> Path:
    """Two snapshotted checkpoints, and a default DVC remote (empty)."""
    directory = project.root / "checkpoints" / "r"
    for step in (1, 2):
        ckpt = write_checkpoint(directory / f"step-{step}.h5", seed=step)
        assert run_cli("snapshot", str(ckpt), "--run", "r", "--step", str(step)).exit_code == 0
    remote = tmp_path / "remote"
    remote.mkdir()
    configure_remote(project, str(remote), "storage")
    return directory


def as_json(*args: str, code: int = 0) -> Any:
    result = run_cli(*args, "--json")
    assert result.exit_code == code, result.output
    assert result.stderr == ""
    return json.loads(result.stdout)


def places(doc: dict[str, Any]) -> dict[str, str]:
    return {Path(c["checkpoint"]).name: c["location"] for c in doc["checkpoints"]}


def test_status_push_and_pull_as_json(project: Project, run_dir: Path, tmp_path: Path) -> None:
    doc = as_json("status", str(run_dir))
    assert doc["ok"] is True
    assert places(doc) == {"step-1.h5": "local", "step-2.h5": "local"}
    assert doc["counts"] == {"local": 2}
    (first, _) = doc["checkpoints"]
    assert first["step"] == 1
    assert first["size"] == (run_dir / "step-1.h5").stat().st_size
    assert first["manifest"] == project.relative(run_dir / "step-1.h5.kaudit.json")

    pushed = as_json("push", str(run_dir))
    assert pushed == {
        "ok": True,
        "failed": [],
        "errors": [],
        "pushed": ["checkpoints/r/step-1.h5", "checkpoints/r/step-2.h5"],
        "uploaded": 2,
        "manifests": 2,
        "not_here": [],
        "repaired": [],
    }
    # the manifests travel with the data, where a run on another machine finds them
    beside = tmp_path / "remote" / "kaudit" / "runs" / "r"
    assert sorted(p.name for p in beside.iterdir()) == [
        "step-1.h5.kaudit.json",
        "step-2.h5.kaudit.json",
    ]
    assert (beside / "step-1.h5.kaudit.json").read_bytes() == (
        run_dir / "step-1.h5.kaudit.json"
    ).read_bytes()
    assert places(as_json("status", str(run_dir))) == {"step-1.h5": "pushed", "step-2.h5": "pushed"}

    discard(Storage(project), run_dir / "step-2.h5")
    assert as_json("push", str(run_dir))["not_here"] == ["checkpoints/r/step-2.h5"]
    assert places(as_json("status", str(run_dir)))["step-2.h5"] == "remote-only"

    pulled = as_json("pull", str(run_dir))
    assert pulled["ok"] is True
    assert pulled["errors"] == []
    assert [
        (Path(r["checkpoint"]).name, r["ok"], r["fetched"], r["data"]) for r in pulled["results"]
    ] == [
        ("step-1.h5", True, False, "local"),
        ("step-2.h5", True, True, "local"),  # fetched, and its bytes the signed ones
    ]
    assert (run_dir / "step-2.h5").exists()


def test_status_json_with_a_corrupt_checkpoint_exits_1(run_dir: Path) -> None:
    ckpt = run_dir / "step-2.h5"
    os.chmod(ckpt, 0o644)
    with open(ckpt, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"tampered")
    doc = as_json("status", "--local-only", str(run_dir), code=1)
    assert doc["ok"] is False
    assert places(doc) == {"step-1.h5": "local", "step-2.h5": "corrupt"}


def test_pull_json_counts_bad_input_among_results(run_dir: Path) -> None:
    broken = run_dir / "step-3.h5.kaudit.json"
    broken.write_text("{")
    doc = as_json("pull", str(run_dir), code=2)
    assert doc["ok"] is False
    assert [r["ok"] for r in doc["results"]] == [True, True]
    (error,) = doc["errors"]
    assert error["path"] == str(broken)
    assert error["exit_code"] == 2
    assert "not valid JSON" in error["error"]


def test_status_before_any_remote_shows_the_places_here(project: Project, key: SigningKey) -> None:
    directory = project.root / "checkpoints" / "r"
    for step in (1, 2):
        ckpt = write_checkpoint(directory / f"step-{step}.h5", seed=step)
        assert run_cli("snapshot", str(ckpt), "--run", "r", "--step", str(step)).exit_code == 0
    (directory / "step-1.h5").unlink()
    shown = run_cli("status", cwd=project.root)  # `kaudit init` with no --remote
    assert shown.exit_code == 0, shown.output
    assert shown.stderr == ""
    assert "checkpoints/r/step-2.h5     2" in shown.stdout
    assert "1 local, 1 missing\nno DVC remote yet: places here only" in shown.stdout
    doc = as_json("status", str(directory))
    assert places(doc) == {"step-1.h5": "missing", "step-2.h5": "local"}
    assert doc["remote_asked"] is False
    # a remote named is asked for, and one that is not there is bad input
    named = run_cli("status", "--remote", "nowhere", cwd=project.root)
    assert named.exit_code == 2
    assert "no DVC remote named 'nowhere'" in named.stderr


def test_status_finds_a_default_remote_named_in_the_local_config_alone(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    # Read from DVC's configuration as DVC merges its levels, not from the tracked file
    # alone: a remote a user set for this machine (`dvc remote add --local -d`) counts.
    ckpt = write_checkpoint(project.root / "checkpoints" / "r" / "step-1.h5", seed=1)
    assert run_cli("snapshot", str(ckpt), "--run", "r", "--step", "1").exit_code == 0
    assert as_json("status", str(ckpt.parent))["remote_asked"] is False
    (tmp_path / "mine").mkdir()
    (project.root / ".dvc" / "config.local").write_text(
        f"[core]\n    remote = mine\n['remote \"mine\"']\n    url = {tmp_path / 'mine'}\n"
    )
    doc = as_json("status", str(ckpt.parent))
    assert doc["remote_asked"] is True
    assert doc["remote_unreachable"] is None
    assert places(doc) == {"step-1.h5": "local"}


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ("[core\nremote = x\n[[[\n", "DVC's configuration cannot be read: config file error"),
        ("[core]\n    nonsense = 1\n", "extra keys not allowed"),
        (None, "is a symbolic link"),
    ],
    ids=["malformed", "unknown-key", "link"],
)
def test_status_refuses_a_hostile_dvc_config_in_one_line(
    project: Project, key: SigningKey, tmp_path: Path, config: str | None, said: str
) -> None:
    ckpt = write_checkpoint(project.root / "checkpoints" / "r" / "step-1.h5", seed=1)
    assert run_cli("snapshot", str(ckpt), "--run", "r", "--step", "1").exit_code == 0
    local = project.root / ".dvc" / "config.local"
    if config is None:
        (tmp_path / "secret").write_text("token = hunter2\n")
        local.symlink_to(tmp_path / "secret")
    else:
        local.write_text(config)
    assert_bad_input(run_cli("status", cwd=project.root), said, no_stdout=True)


def test_status_with_the_remote_down_shows_the_places_here_and_says_so_once(
    project: Project, run_dir: Path
) -> None:
    (run_dir / "step-1.h5").unlink()  # not here: the remote was never heard, so missing
    configure_remote(project, f"ssh://127.0.0.1:{unused_port()}/nowhere")  # nothing listens
    shown = run_cli("status", str(run_dir))
    assert shown.exit_code == 0, shown.output
    assert "1 local, 1 missing" in shown.stdout
    (line,) = shown.stderr.splitlines()  # one line, naming the remote and why
    assert line.startswith("kaudit: warning: the DVC remote 'storage' is unreachable: ")
    assert line.endswith(": places here only (a checkpoint not here is missing)")
    assert "Traceback" not in shown.output

    doc = as_json("status", str(run_dir))
    assert places(doc) == {"step-1.h5": "missing", "step-2.h5": "local"}
    assert doc["remote_asked"] is True
    assert doc["remote_unreachable"].startswith("the DVC remote 'storage' is unreachable: ")

    # asked to check the remote, an unreadable one is an error: one line, exit 2
    required = run_cli("status", "--require-remote", str(run_dir))
    assert required.exit_code == 2
    (line,) = required.stderr.splitlines()
    assert line.startswith("kaudit: error: ")
    assert "the DVC remote 'storage' is unreachable" in line
    assert required.stdout == ""


def test_status_with_a_remote_path_that_cannot_be_read(
    project: Project, run_dir: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the remote's parent should be")
    configure_remote(project, str(blocker / "remote"))
    doc = as_json("status", str(run_dir))
    assert places(doc) == {"step-1.h5": "local", "step-2.h5": "local"}
    assert "is unreachable" in doc["remote_unreachable"]
    assert run_cli("status", "--require-remote", str(run_dir)).exit_code == 2
    # a remote there and reachable: nothing to say
    configure_remote(project, str(tmp_path / "remote"))
    assert as_json("status", "--require-remote", str(run_dir))["remote_unreachable"] is None


def test_status_require_remote_and_local_only_contradict(run_dir: Path) -> None:
    result = run_cli("status", "--local-only", "--require-remote", str(run_dir))
    assert result.exit_code == 2
    assert "contradict" in result.stderr
