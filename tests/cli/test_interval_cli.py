"""`kaudit interval`: Young's and Daly's intervals, --json, --simulate, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kronos_audit.runtime.interval import daly, expected_waste, young
from tests.helpers import run_cli


def test_prints_young_and_daly_with_their_waste() -> None:
    r = run_cli("interval", "--mtbf", "24h", "--cost", "5m")
    assert r.exit_code == 0, r.output
    assert "Young" in r.stdout
    assert "Daly" in r.stdout
    assert "117 min" in r.stdout  # Daly's published optimum for these inputs
    assert "120 min" in r.stdout  # Young's sqrt(2 * 5 min * 24 h)
    waste = expected_waste(daly(300.0, 86400.0), 300.0, 86400.0)
    assert f"{waste:.2%}" in r.stdout


def test_job_adds_its_expected_wall_time() -> None:
    r = run_cli("interval", "--mtbf", "24h", "--cost", "5m", "--restart", "10m", "--job", "500h")
    assert r.exit_code == 0, r.output
    assert "wall time for 500 h of work" in r.stdout
    assert "548 h" in r.stdout  # 500 h / (1 - 8.74 %)


def test_json() -> None:
    r = run_cli("interval", "--mtbf", "6h", "--cost", "5m", "--restart", "10m", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["mtbf"] == 21600.0
    assert doc["cost"] == 300.0
    assert doc["restart"] == 600.0
    assert round(doc["daly"]["tau"] / 60) == 57
    assert doc["young"]["tau"] == pytest.approx(young(300.0, 21600.0))
    assert doc["daly"]["expected_waste"] == pytest.approx(
        expected_waste(doc["daly"]["tau"], 300.0, 21600.0, 600.0)
    )
    assert doc["daly"]["expected_wall"] is None
    assert doc["simulation"] is None


def test_simulate_marks_the_least_measured_waste_at_dalys_interval() -> None:
    r = run_cli("interval", "--mtbf", "6h", "--cost", "5m", "--simulate", "--trials", "400")
    assert r.exit_code == 0, r.output
    assert "Monte Carlo: 400 trials of 300 h of work (50 x MTBF), seed 0" in r.stdout
    # the table's rows: plain lines off a terminal (no box drawing), each with a waste in %
    rows = [line for line in r.stdout.splitlines() if "%" in line and "x " in line]
    assert len(rows) == 9
    (marked,) = [line for line in rows if "◀" in line]
    assert "◀ both" in marked
    assert " 1x " in marked
    assert "56.7 min" in marked
    assert "where the model puts the optimum" in r.stdout


def test_simulate_json() -> None:
    r = run_cli(
        "interval", "--mtbf", "24h", "--cost", "5m", "--restart", "10m", "--job", "500h",
        "--simulate", "--trials", "300", "--seed", "4", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    sim = json.loads(r.stdout)["simulation"]
    assert (sim["job"], sim["trials"], sim["seed"]) == (500 * 3600.0, 300, 4)
    assert [row["factor"] for row in sim["rows"]] == pytest.approx(
        [0.25, 0.3536, 0.5, 0.7071, 1.0, 1.414, 2.0, 2.828, 4.0], rel=1e-3
    )
    assert sim["least_model_factor"] == 1.0
    assert sim["least_measured_factor"] == 1.0
    for row in sim["rows"]:
        assert row["measured_waste"] == pytest.approx(row["model_waste"], rel=0.05)


def test_simulate_is_repeatable_for_a_seed() -> None:
    args = ("interval", "--mtbf", "6h", "--cost", "5m", "--simulate", "--trials", "50")
    assert run_cli(*args, "--seed", "3").stdout == run_cli(*args, "--seed", "3").stdout
    assert run_cli(*args, "--seed", "3").stdout != run_cli(*args, "--seed", "4").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mtbf", "banana", "--cost", "5m"], "--mtbf: 'banana' is not a duration"),
        (["--mtbf", "24h", "--cost", "0"], "--cost: must be more than zero"),
        (["--mtbf", "24h", "--cost", "-5m"], "--cost: '-5m' is not a duration"),
        (["--mtbf", "0s", "--cost", "5m"], "--mtbf: must be more than zero"),
        (["--mtbf", "24h", "--cost", "5m", "--restart", "soon"], "--restart: 'soon'"),
        (["--mtbf", "24h", "--cost", "5m", "--job", "0"], "--job: must be more than zero"),
        (["--mtbf", "24h", "--cost", "5m", "--trials", "0"], "--trials: must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    refused_in_one_line(args, message)


def refused_in_one_line(args: list[str], message: str) -> None:
    """`kaudit interval ARGS` exits 2 with one line on stderr starting with ``message``."""
    r = run_cli("interval", *args)
    assert r.exit_code == 2
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("kaudit: error: " + message)


def test_installed_kaudit_reports_bad_input_without_a_traceback() -> None:
    kaudit = Path(sys.executable).parent / "kaudit"
    if not kaudit.exists():
        pytest.skip("kaudit is not installed beside this Python")
    r = subprocess.run(
        [str(kaudit), "interval", "--mtbf", "banana", "--cost", "5m"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith("kaudit: error: --mtbf: 'banana' is not a duration")
