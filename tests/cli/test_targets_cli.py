"""What each command takes as a target (kronos_audit.checkpoint.layout): a run directory holding
everything kaudit writes there (attestations, hidden lock files), a checkpoint for its
manifest, a sharded step's directory; and one clear line for a file with no manifest."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from kronos_audit.storage import configure_remote
from tests.checkpoint.test_shards import sharded_step
from tests.helpers import KAUDIT, assert_bad_input, run_cli, write_checkpoint
from tests.replay.conftest import heat, replay_tmp, repo
from tests.replay.helpers import manifest

__all__ = ["heat", "replay_tmp", "repo"]


@pytest.fixture
def attested(heat: Path, repo: Path, tmp_path: Path) -> Path:
    """The heat run (steps 10, 20, 30), step 20 replayed with --attest, a hidden lock
    file of kaudit's beside them, and a DVC remote in a directory; its run directory."""
    result = run_cli("replay", str(manifest(heat, 20)), "--attest")
    assert result.exit_code == 0, result.output
    assert (heat / "step-00000020.h5.replay.json").is_file()
    (heat / ".kaudit-writer.lock").write_text("12345\n")
    remote = tmp_path / "remote"
    remote.mkdir()
    configure_remote(find_project(repo), str(remote), "storage")
    return heat


def test_every_command_walks_a_run_directory_with_attestations(
    attested: Path, repo: Path, tmp_path: Path
) -> None:
    run = str(attested)
    for args in (
        ("status", run),
        ("status", run, "--local-only"),
        ("push", run),
        ("pull", run),
        ("log", run),
        ("verify", run),
        ("report", run, "--out", str(tmp_path / "report.json")),
    ):
        result = run_cli(*args, cwd=repo)
        assert result.exit_code == 0, (args, result.output)
        assert "Traceback" not in result.output
    status = json.loads(run_cli("status", run, "--json").stdout)
    assert [Path(c["checkpoint"]).name for c in status["checkpoints"]] == [
        f"step-{s:08d}.h5" for s in (10, 20, 30)
    ]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verdict"] == "PASS"
    gate = run_cli("gate", cwd=repo)
    assert gate.exit_code == 0, gate.output


def test_a_checkpoint_stands_for_its_manifest(attested: Path, repo: Path, tmp_path: Path) -> None:
    checkpoint = attested / "step-00000020.h5"
    named = run_cli("show", str(manifest(attested, 20)))
    assert named.exit_code == 0, named.output
    assert run_cli("show", str(checkpoint)).stdout == named.stdout
    for args in (
        ("verify", str(checkpoint)),
        ("status", str(checkpoint)),
        ("push", str(checkpoint)),
        ("pull", str(checkpoint)),
        ("log", str(checkpoint)),
        ("report", str(checkpoint), "--out", str(tmp_path / "report.md")),
        ("replay", str(checkpoint)),
    ):
        result = run_cli(*args, cwd=repo)
        assert result.exit_code == 0, (args, result.output)
    verified = json.loads(run_cli("verify", str(checkpoint), "--json").stdout)
    assert [r["manifest"] for r in verified["results"]] == [
        manifest(attested, 20).relative_to(repo.resolve()).as_posix()
    ]
    status = json.loads(run_cli("status", str(checkpoint), "--json").stdout)
    assert [c["manifest"] for c in status["checkpoints"]] == [
        manifest(attested, 20).relative_to(repo.resolve()).as_posix()
    ]


def test_a_file_with_no_manifest_beside_it_is_one_line_and_nothing_is_written(
    attested: Path, repo: Path, tmp_path: Path
) -> None:
    stray = write_checkpoint(attested / "stray.h5")
    out = tmp_path / "report.html"
    before = sorted(p.name for p in attested.iterdir())
    for args in (
        ("verify", str(stray)),
        ("verify", str(manifest(attested, 10)), str(stray)),
        ("show", str(stray)),
        ("replay", str(stray), "--attest"),
        ("status", str(stray)),
        ("push", str(stray)),
        ("pull", str(stray)),
        ("log", str(stray)),
        ("report", str(stray), "--out", str(out)),
        ("report", str(attested), str(stray), "--out", str(out)),
        ("bisect", str(stray), str(attested)),
    ):
        result = run_cli(*args, cwd=repo)
        line = assert_bad_input(result, "stray.h5", "no manifest beside this file")
        assert "stray.h5.kaudit.json" in line, args
    assert not out.exists()  # no FAIL report for a name that is nothing to report on
    assert sorted(p.name for p in attested.iterdir()) == before
    gone = attested / "nothing.h5"
    assert_bad_input(run_cli("verify", str(gone)), "nothing.h5", "no such")


def test_the_installed_kaudit_takes_a_checkpoint_and_refuses_a_stray_file(
    attested: Path, repo: Path
) -> None:
    shown = subprocess.run(
        [*KAUDIT, "show", str(attested / "step-00000030.h5"), "--json"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["predicate"]["step"] == 30
    stray = write_checkpoint(attested / "stray.h5")
    refused = subprocess.run(
        [*KAUDIT, "verify", str(stray)], cwd=repo, capture_output=True, text=True
    )
    assert refused.returncode == 2
    (line,) = refused.stderr.splitlines()
    assert line.startswith("kaudit: error: ")
    assert "stray.h5" in line
    assert "no manifest beside this file" in line
    assert refused.stdout == ""


def test_a_sharded_step_directory_stands_for_its_step_manifest(
    project: Project, key: SigningKey
) -> None:
    step = sharded_step(project, key, 5, parent=sharded_step(project, key, 4))
    directory = step.path.parent
    assert directory.name == "step-00000005"
    (directory.parent / ".kaudit-writer.lock").write_text("")
    shown = run_cli("show", str(directory), "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["predicate"]["step"] == 5
    verified = run_cli("verify", str(directory), "--json")
    assert verified.exit_code == 0, verified.output
    assert [r["manifest"] for r in json.loads(verified.stdout)["results"]] == [
        project.relative(step.path)
    ]
    status = run_cli("status", str(directory), "--local-only", "--json")
    assert status.exit_code == 0, status.output
    assert [c["step"] for c in json.loads(status.stdout)["checkpoints"]] == [5]
    # the run's directory holds the steps' directories: both steps, walked
    everything = run_cli("status", str(directory.parent), "--local-only", "--json")
    assert [c["step"] for c in json.loads(everything.stdout)["checkpoints"]] == [4, 5]
    empty = directory.parent / "step-00000009"
    empty.mkdir()
    assert_bad_input(run_cli("show", str(empty)), "step-00000009", "index.jsonl.kaudit.json")
