"""Every ``--json`` names files the same way: POSIX paths relative to the repository's top
(absolute outside it), whichever directory the command runs from and however the paths
were given on its command line; as the report, the gate and the manifests name them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage import configure_remote
from tests.helpers import run_cli

# The keys under which a command's JSON names a file of the repository.
FILE_KEYS = {"manifest", "checkpoint", "directory", "newest", "path", "out", "pushed"}


def named_files(doc: Any, key: str = "") -> Iterator[str]:
    """Every string the document gives under one of FILE_KEYS, at any depth."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from named_files(v, k)
    elif isinstance(doc, list):
        for v in doc:
            yield from named_files(v, key)
    elif isinstance(doc, str) and key in FILE_KEYS:
        yield doc


def json_of(*args: str, cwd: Path) -> Any:
    result = run_cli(*args, "--json", cwd=cwd)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_every_command_names_files_relative_to_the_repository(
    project: Project, key: SigningKey, checkpoint: Path, tmp_path: Path
) -> None:
    assert run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1").exit_code == 0
    configure_remote(project, str(tmp_path / "remote"))
    manifest = "checkpoints/run1/step-00000001.h5.kaudit.json"
    data = "checkpoints/run1/step-00000001.h5"
    deep = project.root / "checkpoints" / "run1"
    report = tmp_path / "report.json"

    seen: dict[str, set[str]] = {}
    # From below the top, paths given relative to there, absolutely, or not at all.
    for name, args, cwd in [
        ("push", ("push", "."), deep),
        ("status", ("status", str(deep)), project.root / "checkpoints"),
        ("verify", ("verify", "step-00000001.h5.kaudit.json"), deep),
        ("verify all", ("verify",), deep),
        ("log", ("log",), deep),
        ("pull", ("pull", "../run1"), deep),
        ("report", ("report", "--out", str(report), "--format", "json", "."), deep),
        ("report's file", None, deep),
    ]:
        doc = json.loads(report.read_text()) if args is None else json_of(*args, cwd=cwd)
        seen[name] = set(named_files(doc))
    expected = {
        "push": {data},
        "status": {data, manifest},
        "verify": {data, manifest},
        "verify all": {data, manifest},
        "log": {"checkpoints/run1", manifest},
        "pull": {data, manifest},
        "report": {report.resolve().as_posix()},  # outside the repository: absolute
    }
    for name, files in expected.items():
        assert seen[name] == files, name
    # the report's own JSON names the run and the manifest the same way
    assert {"checkpoints/run1", manifest} <= seen["report's file"]
