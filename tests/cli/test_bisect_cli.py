"""`kaudit bisect` (kronos_audit.cli.commands.bisect): the report, exit codes 0/1/2, the
tolerance options and [compare] config shared with `kaudit diff`, --json, bad input as one line."""

from __future__ import annotations

import base64
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import Result

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from tests.helpers import assert_bad_input as _assert_bad_input
from tests.helpers import run_cli
from tests.history.test_bisect import PLANTED, key, manifest, project, runs, solver

__all__ = ["key", "project", "runs"]
"""test_bisect's fixtures: ``runs`` (run A, and run B perturbed by 1e-13 in /fields/v from
step 23 on, 40 steps) recorded once for the session, each test with its own copy."""


def assert_bad_input(result: Result, *mentions: str) -> str:
    return _assert_bad_input(result, *mentions, no_stdout=True)


def test_the_planted_divergence_exits_1_with_the_report(runs: tuple[Path, Path]) -> None:
    a, b = runs
    r = run_cli("bisect", str(a), str(b))
    assert r.exit_code == 1, r.output
    out = r.stdout
    assert f"A: {manifest(a, 40)}" in out
    assert "run env-a, 40 checkpoints, steps 1..40, chain verified" in out
    assert "40 common steps (1..40); tolerance: exact (bitwise)" in out
    assert "step 23: the checkpoints diverge first; step 22 agrees" in out
    assert "/fields/v DIFFERENT: 256 of 256 elements fail" in out  # diff's details
    assert "first [0, 0]" in out
    # all the others identical: the fields, /kaudit/tree and the /rng generator states
    # (torch's too when another test of this process imported torch)
    summary = re.search(r"FAIL: (\d+) datasets: (\d+) identical, 1 different", out)
    assert summary is not None, out
    assert int(summary[2]) == int(summary[1]) - 1 >= 6
    last = out.strip().splitlines()[-1]
    assert last.startswith("DIVERGED at step 23 (after step 22): /fields/v (")
    assert "of 40 common steps compared, 1 reading data" in last
    assert r.stderr == ""


def test_manifests_and_run_directories_are_both_accepted(runs: tuple[Path, Path]) -> None:
    a, b = runs
    for args in ([manifest(a, 40), manifest(b, 40)], [a, manifest(b, 40)], [manifest(a, 40), b]):
        r = run_cli("bisect", *map(str, args))
        assert r.exit_code == 1, (args, r.output)
        assert "step 23: the checkpoints diverge first" in r.stdout


def test_json_has_everything(runs: tuple[Path, Path]) -> None:
    a, b = runs
    r = run_cli("bisect", "--json", str(a), str(b))
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["format"] == "kronos-audit/bisect/v1"
    assert doc["diverged"] is True
    assert (doc["first_divergent_step"], doc["last_agreeing_step"]) == (PLANTED, PLANTED - 1)
    (first,) = doc["diverged_datasets"]
    assert first["path"] == "/fields/v"
    assert first["verdict"] == "DIFFERENT"
    assert first["worst_mismatch"]["abs_error"] == pytest.approx(1e-13, rel=0.01)
    assert doc["diverged_paths"] == ["/fields/v"]
    assert doc["comparisons"] == len(doc["probes"]) <= math.ceil(math.log2(40)) + 2
    assert doc["data_comparisons"] == 1
    assert doc["common_steps"] == list(range(1, 41))
    assert doc["policy"] == {"default": None, "rules": []}
    assert doc["a"]["run"] == "env-a"
    assert doc["b"]["head"] == find_project(b).relative(manifest(b, 40))
    assert not doc["b"]["head"].startswith("/")
    assert doc["b"]["checkpoints"] == 40
    by_step = {p["step"]: p for p in doc["probes"]}
    assert by_step[PLANTED]["agrees"] is False
    assert by_step[PLANTED - 1]["agrees"] is True
    assert by_step[PLANTED]["comparison"]["counts"]["DIFFERENT"] == 1
    assert by_step[PLANTED - 1]["decided_by"] == "hashes"
    assert doc["config"].endswith(".kaudit/config.toml")


def test_a_tolerance_that_absorbs_it_exits_0(runs: tuple[Path, Path]) -> None:
    a, b = runs
    for args in (["--rtol", "1e-9"], ["--atol", "1e-11"], ["--tol", "fields/*:rtol=1e-9"]):
        r = run_cli("bisect", str(a), str(b), *args)
        assert r.exit_code == 0, (args, r.output)
        last = r.stdout.strip().splitlines()[-1]
        assert last.startswith("ok: the runs never diverge: the last common step 40 agrees")
    assert "tolerance: --tol fields/*:rtol=1e-09,atol=0; otherwise exact (bitwise)" in r.stdout
    # too tight, or the wrong datasets named
    assert run_cli("bisect", str(a), str(b), "--rtol", "1e-15").exit_code == 1
    assert run_cli("bisect", str(a), str(b), "--tol", "t:rtol=1").exit_code == 1


def test_defaults_come_from_the_compare_config(project: Project, runs: tuple[Path, Path]) -> None:
    a, b = runs
    with project.config_path.open("a") as f:
        f.write("\n[compare]\nrtol = 1e-9\n")
    r = run_cli("bisect", str(a), str(b))
    assert r.exit_code == 0, r.output
    assert "tolerance: float data rtol=1e-09,atol=0" in r.stdout
    # an option given on the command line overrides the config's key
    assert run_cli("bisect", str(a), str(b), "--rtol", "0").exit_code == 1


def test_identical_runs_exit_0(project: Project, key: SigningKey) -> None:
    a, b = solver(project, "one", steps=10), solver(project, "two", steps=10)
    r = run_cli("bisect", str(a), str(b))
    assert r.exit_code == 0, r.output
    assert "compared: 10 agrees (hashes)" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == (
        "ok: the runs never diverge: the last common step 10 agrees "
        "(1 of 10 common steps compared, 0 reading data)"
    )


def test_divergence_at_the_first_common_step(project: Project, key: SigningKey) -> None:
    a = solver(project, "a", steps=10)
    b = solver(project, "b", steps=10, perturb_from=1)
    r = run_cli("bisect", str(a), str(b))
    assert r.exit_code == 1, r.output
    assert "step 1: the checkpoints diverge first; it is the first common step" in r.stdout
    assert (
        r.stdout.strip()
        .splitlines()[-1]
        .startswith("DIVERGED at step 1 (at the first common step): /fields/v")
    )


def _rewrite_payload(path: Path) -> None:
    envelope = json.loads(path.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["seeds"] = [666]
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    path.write_text(json.dumps(envelope, indent=2))


def test_a_chain_that_does_not_verify_is_one_line_exit_2(runs: tuple[Path, Path]) -> None:
    a, b = runs
    _rewrite_payload(manifest(b, 10))
    line = assert_bad_input(run_cli("bisect", str(a), str(b)), "run B", "was altered")
    assert line.startswith(
        f"kaudit: error: {manifest(b, 11)}: run B: the chain does not verify at step 11"
    )


def test_an_unsigned_head_is_one_line_exit_2(runs: tuple[Path, Path]) -> None:
    a, b = runs
    head = manifest(a, 40)
    head.write_text(json.dumps({**json.loads(head.read_text()), "signatures": []}))
    assert_bad_input(run_cli("bisect", str(a), str(b)), str(head), "run A", "no signature")


def test_bad_input_is_one_line_exit_2(
    project: Project, runs: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = runs
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    assert_bad_input(
        run_cli("bisect", str(a), str(notes)), str(notes), "no manifest beside this file"
    )
    assert_bad_input(run_cli("bisect", str(a), str(tmp_path / "gone")), "not found")
    empty = project.root / "empty"
    empty.mkdir()
    assert_bad_input(run_cli("bisect", str(empty), str(b)), str(empty), "no manifest")
    assert_bad_input(run_cli("bisect", str(a), str(b), "--rtol", "x"), "--rtol", "number")
    assert_bad_input(run_cli("bisect", str(a), str(b), "--tol", "nocolon"), "PATTERN:SPEC")
    short = solver(project, "short", steps=1)  # step 1 only
    later = solver(project, "later", steps=3, every=3)  # step 3 only
    assert_bad_input(run_cli("bisect", str(short), str(later)), "no step in common")


def test_bisect_through_the_console_script(runs: tuple[Path, Path]) -> None:
    a, b = runs
    cmd = [sys.executable, "-c", "from kronos_audit.cli import main; main()", "bisect"]
    run = subprocess.run([*cmd, str(a), str(b)], capture_output=True, text=True, check=False)
    assert run.returncode == 1, run.stderr
    assert "DIVERGED at step 23" in run.stdout
    run = subprocess.run(
        [*cmd, str(a), str(b), "--rtol", "1e-9", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["diverged"] is False
