"""`kaudit log`: real runs (ka.Run, with retention), their chains summarised; the DVC
remote asked with --remote; hostile names printed as text; plain output off a terminal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.location import Location
from kronos_audit.history.log import run_log
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage import Storage, configure_remote
from tests.helpers import discard, run_cli, untrusted_key, write_checkpoint


def run(project: Project, name: str, steps: int, *, keep: int | None = None) -> Path:
    """A real run of ``steps`` checkpoints (one per step); returns its directory."""
    root = project.root / "checkpoints"
    with ka.Run(name, root=root, seed=7, every=ka.EverySteps(1), keep=keep) as r:
        state = r.restore() or {"u": r.rng.random((8, 8))}
        for step in r.steps(steps):
            state = {"u": 0.5 * state["u"] + r.rng.random((8, 8))}
            r.checkpoint(step, state)
    return root / name


def log_json(*args: str, code: int = 0) -> dict[str, Any]:
    result = run_cli("log", "--json", *args)
    assert result.exit_code == code, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_every_run_of_the_repository(project: Project, key: SigningKey) -> None:
    heat = run(project, "heat", 4)
    pruned = run(project, "kept", 5, keep=2)
    result = run_cli("log", "--json", cwd=project.root)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["errors"] == []
    by_run = {r["run"]: r for r in doc["runs"]}
    assert set(by_run) == {"heat", "kept"}
    h = by_run["heat"]
    assert (h["first_step"], h["newest_step"], h["count"]) == (1, 4, 4)
    assert h["directory"] == project.relative(heat)
    assert h["newest"] == "checkpoints/heat/step-00000004.h5.kaudit.json"
    newest = ka.read_manifest(heat / "step-00000004.h5.kaudit.json")
    assert h["commit"] == newest.record.git.commit
    assert h["created"] == newest.record.created
    assert h["signer"]["ok"] is True
    assert h["signer"]["name"] == "tester"
    assert h["signer"]["key_id"].startswith(key.key_id[:16])
    assert h["data"] == {"local": 4}
    k = by_run["kept"]
    assert (k["first_step"], k["newest_step"], k["count"]) == (1, 5, 5)
    assert k["data"] == {"local": 2, "pruned": 3}
    assert k["directory"] == project.relative(pruned)


def test_text_names_signer_and_places_plainly(project: Project, key: SigningKey) -> None:
    run(project, "heat", 3, keep=1)
    result = run_cli("log", str(project.root / "checkpoints" / "heat"), cwd=project.root)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "run heat  checkpoints/heat"  # from where one stands
    assert lines[1] == "  checkpoints 3 (steps 1..3), newest step 3"
    assert lines[3].startswith(f"  signer      tester {key.key_id[:16]}")
    assert lines[5] == "  data        1 local, 2 pruned"
    assert "\x1b" not in result.stdout  # off a terminal: plain text


def test_an_untrusted_signer_and_a_hostile_run_id(project: Project, key: SigningKey) -> None:
    directory = project.root / "checkpoints" / "odd"
    ckpt = write_checkpoint(directory / "step-1.h5", seed=1)
    hostile = "x[red]y\x1b[2J"
    mallory = untrusted_key("mallory")
    snap = run_cli("snapshot", str(ckpt), "--run", hostile, "--step", "1", "--key", "mallory")
    assert snap.exit_code == 0, snap.output
    result = run_cli("log", str(directory), cwd=project.root)
    assert result.exit_code == 0, result.output
    assert "run x[red]y\\x1b[2J" in result.stdout
    assert "\x1b" not in result.stdout
    (signer,) = [line for line in result.stdout.splitlines() if "signer" in line]
    assert signer.startswith(f"  signer      unknown signer (claims key {mallory.key_id[:16]}): ")


def test_remote_asked_only_with_the_flag(project: Project, key: SigningKey, tmp_path: Path) -> None:
    run_dir = run(project, "heat", 3)
    remote = tmp_path / "remote"
    remote.mkdir()
    configure_remote(project, str(remote), "storage")
    assert run_cli("push", str(run_dir)).exit_code == 0
    discard(Storage(project), run_dir / "step-00000002.h5")
    (run_dir / "step-00000003.h5").unlink()  # never pushed again: gone from here only
    # without the remote: not here and not pruned is missing; --remote tells remote-only
    assert log_json(str(run_dir))["runs"][0]["data"] == {"local": 1, "missing": 2}
    assert log_json(str(run_dir), "--remote")["runs"][0]["data"] == {"pushed": 1, "remote-only": 2}


def test_library_reads_each_manifest_once_and_reports_bad_ones(
    project: Project, key: SigningKey
) -> None:
    run_dir = run(project, "heat", 3)
    bad = run_dir / "step-00000009.h5.kaudit.json"
    bad.write_text("{not json")
    seen: list[tuple[str, int, int]] = []
    log = run_log(project, [run_dir], progress=lambda *a: seen.append(a))
    assert [r.count for r in log.runs] == [3]
    assert log.runs[0].locations[Location.LOCAL] == 3
    assert [e.path for e in log.problems] == [bad]
    assert seen[-1] == ("reading manifests", 4, 4)
    result = run_cli("log", str(run_dir))
    assert result.exit_code == 2
    assert result.stderr.startswith("kaudit: error: ")
    assert "run heat" in result.stdout


def test_no_such_run_directory(project: Project) -> None:
    result = run_cli("log", str(project.root / "nowhere"))
    assert result.exit_code == 2
    assert "no such run directory" in result.stderr


@pytest.mark.parametrize("args", [(), ("--json",)])
def test_help_has_an_example(args: tuple[str, ...]) -> None:
    result = run_cli("log", "--help", *args)
    assert result.exit_code == 0
    assert "Example:" in result.stdout


def test_a_sharded_run_is_one_run_of_its_steps(project: Project, key: SigningKey) -> None:
    from tests.checkpoint.test_shards import sharded_step

    first = sharded_step(project, key, 1)
    sharded_step(project, key, 2, parent=first)
    result = run_cli("log", "--json", cwd=project.root)
    assert result.exit_code == 0, result.output
    (heat,) = json.loads(result.stdout)["runs"]  # not one run per step directory
    assert (heat["run"], heat["first_step"], heat["newest_step"], heat["count"]) == (
        "heat",
        1,
        2,
        2,
    )
    assert heat["directory"] == "checkpoints/heat"
    assert heat["data"] == {"local": 2}
