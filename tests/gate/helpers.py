"""Helpers the gate's tests import: run the gate, read its JSON and its JUnit XML."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from junitparser import Error as JUnitError
from junitparser import Failure, JUnitXml, TestCase

from tests.helpers import run_cli


def gate_json(repo: Path, *args: str, exit_code: int = 0) -> dict[str, Any]:
    """`kaudit gate --json` in ``repo``, expecting ``exit_code``."""
    result = run_cli("gate", "--json", *args, cwd=repo)
    assert result.exit_code == exit_code, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    assert doc["ok"] is (exit_code == 0)
    return doc


def set_gate(repo: Path, section: str) -> None:
    """Put ``section`` (the body of a [gate] table) in the work tree's config."""
    config = repo / ".kaudit" / "config.toml"
    text = config.read_text().split("\n[gate]\n")[0]
    config.write_text(text + "\n[gate]\n" + section + "\n")


def junit_cases(path: Path) -> dict[str, TestCase]:
    """The JUnit file's test cases by ``classname/name``, read by junitparser."""
    xml = JUnitXml.fromfile(str(path))
    cases: dict[str, TestCase] = {}
    for suite in xml:
        for case in suite:
            cases[f"{case.classname}/{case.name}"] = case
    return cases


def problems(case: TestCase) -> list[tuple[str, str, str]]:
    """(failure or error, message, text) of each problem a case reports."""
    return [
        ("failure" if isinstance(r, Failure) else "error", r.message or "", r.text or "")
        for r in case.result
        if isinstance(r, Failure | JUnitError)
    ]
