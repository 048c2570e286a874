"""`kaudit interval --level`: each level's interval, the durable level alone beside it,
--simulate side by side, --json, and bad input."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from kronos_audit.runtime.levels.interval import (
    LevelCost,
    expected_waste,
    optimal_plan,
    single_level,
)
from tests.cli.test_interval_cli import refused_in_one_line
from tests.helpers import run_cli

LEVELS = (
    "--level",
    "memory:cost=0.05s,mtbf=6h",
    "--level",
    "partner:cost=0.2s,mtbf=2d",
    "--level",
    "durable:cost=30s,restart=60s,mtbf=30d",
)
COSTS = (
    LevelCost("memory", 0.05, 6 * 3600.0, 0.05),
    LevelCost("partner", 0.2, 2 * 86400.0, 0.2),
    LevelCost("durable", 30.0, 30 * 86400.0, 60.0),
)


@pytest.fixture(scope="module")
def doc() -> dict[str, object]:
    r = run_cli("interval", *LEVELS, "--job", "500h", "--json")
    assert r.exit_code == 0, r.output
    parsed = json.loads(r.stdout)
    assert isinstance(parsed, dict)
    return parsed


def test_json_gives_each_levels_interval_and_the_durable_level_alone(
    doc: dict[str, object],
) -> None:
    plan = optimal_plan(COSTS)
    levels = doc["levels"]
    assert isinstance(levels, dict)
    assert [x["name"] for x in levels["levels"]] == ["memory", "partner", "durable"]
    assert [x["every"] for x in levels["levels"]] == list(plan.every)
    assert [x["interval"] for x in levels["levels"]] == pytest.approx(list(plan.seconds()))
    assert levels["levels"][2]["restart"] == 60.0
    assert levels["levels"][0]["restart"] == 0.05  # the cost, when not given
    assert levels["expected_waste"] == pytest.approx(
        expected_waste(COSTS, levels["interval"], plan.every)
    )
    assert levels["expected_wall"] == pytest.approx(500 * 3600 / (1 - plan.waste))
    alone = doc["durable_only"]
    assert isinstance(alone, dict)
    assert alone["levels"][0]["mtbf"] == pytest.approx(single_level(COSTS).mtbf)
    assert alone["expected_waste"] > 5 * levels["expected_waste"]
    assert doc["simulation"] is None


def test_it_prints_a_row_per_level_and_the_waste_of_both() -> None:
    r = run_cli("interval", *LEVELS)
    assert r.exit_code == 0, r.output
    plan = optimal_plan(COSTS)
    rows = r.stdout.splitlines()
    assert rows[1].split()[0] == "memory"
    assert f"{plan.every[1]} x memory" in rows[2]
    assert f"{plan.every[2] // plan.every[1]} x partner" in rows[3]
    assert f"expected waste {plan.waste:.2%}" in r.stdout
    assert "Moody et al., SC'10" in r.stdout
    assert "durable level alone, against every failure" in r.stdout


def test_simulate_shows_one_level_and_the_levels_side_by_side() -> None:
    r = run_cli("interval", *LEVELS, "--simulate", "--trials", "2000", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    sim = doc["simulation"]
    assert (sim["failures"], sim["seed"]) == (2000, 0)
    for key in ("levels", "durable_only"):
        model, measured = doc[key]["expected_waste"], sim[key]
        assert abs(measured["measured_waste"] - model) < 4 * measured["stderr"]
    # the levels lose far less work per failure than the durable level alone
    assert sim["levels"]["lost_work_per_failure"] < sim["durable_only"]["lost_work_per_failure"] / 3
    assert sum(sim["levels"]["restores"][:2]) > sim["levels"]["restores"][2]
    text = run_cli("interval", *LEVELS, "--simulate", "--trials", "300").stdout
    assert "Monte Carlo: about 300 failures per plan, seed 0" in text
    assert "durable alone" in text
    assert "3 levels" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--level", "memory:cost=5s"], "--level 'memory:cost=5s': needs mtbf=DURATION"),
        (["--level", "memory"], "--level 'memory': write NAME:cost=DURATION,mtbf=DURATION"),
        (["--level", "m:cost=1s,mtbf=0"], "--level 'm:cost=1s,mtbf=0': mtbf must be more than"),
        (["--level", "m:cost=0,mtbf=1h"], "--level 'm:cost=0,mtbf=1h': cost must be more than"),
        (["--level", "m:cost=x,mtbf=1h"], "--level 'm:cost=x,mtbf=1h': cost: 'x' is not a"),
        (
            ["--level", "m:cost=1s,mtbf=1h,red=1"],
            "--level 'm:cost=1s,mtbf=1h,red=1': 'red=1' is not one of cost=, mtbf=, restart=",
        ),
        (
            ["--level", "m:cost=1s,cost=2s,mtbf=1h"],
            "--level 'm:cost=1s,cost=2s,mtbf=1h': cost= given",
        ),
        (["--level", "[red]x:cost=1s,mtbf=1h"], "--level '[red]x:cost=1s,mtbf=1h': write NAME"),
        (["--level", "a:cost=1s,mtbf=1h"] * 2, "--level: two levels share a name: a, a"),
        (["--level", "a:cost=1s,mtbf=1h", "--cost", "5m"], "--cost and --level exclude each"),
        (["--cost", "5m"], "--mtbf is required (or give the levels with --level)"),
        (["--mtbf", "5h"], "--cost is required"),
        (
            [x for i in range(9) for x in ("--level", f"l{i}:cost=1s,mtbf=1h")],
            "at most 8 levels, got 9",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    refused_in_one_line(args, message)


def test_a_plan_that_loses_everything_is_said_and_not_simulated() -> None:
    r = run_cli(
        "interval", "--level", "a:cost=10s,mtbf=1s", "--level", "b:cost=100s,mtbf=2s", "--simulate"
    )
    assert r.exit_code == 0, r.output
    assert "expected waste 100.00%" in r.stdout
    assert r.stdout.count("not simulated") == 2


DOC = Path(__file__).resolve().parents[2] / "docs" / "interval.md"


def doc_examples() -> list[tuple[str, str]]:
    """Each ``$ kaudit interval --level ...`` block of docs/interval.md: its command line and
    the output it shows."""
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"^```\n\$ (kaudit interval --level[^\n]*)\n(.*?)^```$", text, re.M | re.S)
    assert len(blocks) == 2, "docs/interval.md shows two runs with --level"
    return blocks


@pytest.mark.parametrize(("command", "shown"), doc_examples(), ids=["plan", "simulate"])
def test_the_docs_show_what_the_command_prints(command: str, shown: str) -> None:
    r = run_cli(*shlex.split(command)[1:])
    assert r.exit_code == 0, r.output
    assert r.stdout == shown
