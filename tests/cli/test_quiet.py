"""`-q` (kronos_audit.cli.output): a command that succeeds prints nothing at all, on stdout
or stderr, as `git commit -q` and `dvc pull -q` do; one that fails still says why, and
exits 1 or 2; `--json` still prints the document it asks for."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import kronos_audit as ka
from kronos_audit.cli._app import COMMANDS
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage import configure_remote
from tests.helpers import assert_bad_input, run_cli, write_checkpoint

# Their -q is pinned where their runs are made: tests/gate/test_gate.py (gate),
# tests/cli/test_progress.py (replay, on a terminal). `completion` prints its script
# with -q too: it is what was asked for, as --json's document is.
ELSEWHERE = {"gate", "replay", "completion"}


def two_runs(project: Project) -> tuple[Path, Path]:
    """Runs r (steps 1, 2) and s (step 1, the same data as r's), snapshotted with -q."""
    made = []
    for run, steps in (("r", (1, 2)), ("s", (1,))):
        parent: list[str] = []
        for step in steps:
            ckpt = write_checkpoint(project.root / "checkpoints" / run / f"step-{step}.h5", step)
            quiet = run_cli("snapshot", "-q", str(ckpt), "--run", run, "--step", str(step), *parent)
            assert quiet.exit_code == 0, quiet.output
            assert quiet.stdout == quiet.stderr == ""
            parent = ["--parent", f"{ckpt}.kaudit.json"]
        made.append(ckpt.parent)
    return made[0], made[1]


def array_campaign(project: Project) -> None:
    """Campaign mc, done by the two tasks of a job array."""
    for task in range(2):
        with ka.Run(
            "mc", root=project.root / "checkpoints", seed=3, task=ka.ArrayTask(task, 2)
        ) as run:
            run.map_batches(lambda rng: rng.random(), 4)


def test_every_command_that_succeeds_prints_nothing(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    r, s = two_runs(project)
    array_campaign(project)
    configure_remote(project, str(tmp_path / "remote"), "storage")
    first = str(r / "step-1.h5")
    runs = [
        ("init", "-q"),
        ("-q", "keys", "list"),
        ("keys", "generate", "--name", "second", "-q"),
        ("verify", "-q", str(r)),
        ("-q", "verify"),  # every run of the repository
        ("status", "-q"),
        ("log", "-q"),
        ("show", "-q", first),
        ("diff", "-q", first, str(s / "step-1.h5")),
        ("bisect", "-q", str(r), str(r)),
        ("report", "-q", "--out", str(tmp_path / "report.html")),
        ("push", "-q"),
        ("pull", "-q", str(r)),
        ("interval", "-q", "--mtbf", "6h", "--cost", "5min"),
        ("run", "-q", "--", sys.executable, "-c", "pass"),
        ("campaign", "-q", "mc"),
    ]
    for args in runs:
        result = run_cli(*args, cwd=project.root)
        assert result.exit_code == 0, (args, result.output)
        assert (result.stdout, result.stderr) == ("", ""), args
    (tmp_path / "report.html").unlink()
    named = {a for args in runs for a in args if a in COMMANDS} | {"snapshot"}  # two_runs
    assert named | ELSEWHERE == set(COMMANDS)  # a new command gets its -q checked here
    # --json is what was asked for: printed with -q too
    doc = json.loads(run_cli("-q", "verify", str(r), "--json").stdout)
    assert doc["summary"]["manifests"] == 2


def test_with_quiet_a_failure_still_says_why(project: Project, key: SigningKey) -> None:
    r, _ = two_runs(project)
    ckpt = r / "step-2.h5"
    os.chmod(ckpt, 0o644)
    with open(ckpt, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"tampered")
    verify = run_cli("verify", "-q", str(r))
    assert verify.exit_code == 1
    assert verify.stderr == ""
    lines = verify.stdout.splitlines()
    assert lines[0].startswith(f"FAIL {ckpt}.kaudit.json  (run r, step 2")
    assert "step-1.h5" not in verify.stdout  # what passed is not printed
    assert lines[1].startswith("      file digest: ")
    status = run_cli("-q", "status", "--local-only", str(r))
    assert status.exit_code == 1
    # paths as git names them: relative to where one stands, absolute outside its work tree
    assert status.stdout == f"corrupt {ckpt}: not the bytes its manifest signs\n"
    assert_bad_input(run_cli("-q", "verify", str(r / "nothing.h5")), "nothing.h5")
