"""Where a checkpoint's data is: `kaudit log`, `status`, `verify` and `report` say it in
one set of words (kronos_audit.checkpoint.location), in their text and their JSON. A real
run with retention: one step pruned by its signed record, one deleted, one altered, the
newest here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.layout import checkpoint_name
from kronos_audit.checkpoint.location import Location
from kronos_audit.keys.anchors import load_keyring
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.verification.batch import verify
from kronos_audit.verification.verifier import Verifier
from tests.helpers import discard, run_cli

WORDS = {loc.value for loc in Location}
SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "report-v1.schema.json"


@pytest.fixture
def run_dir(project: Project, key: SigningKey) -> Path:
    """Steps 1..4 kept 3 at a time: step 1 pruned (signed record), step 2 deleted
    (missing), step 3 altered in place (corrupt), step 4 as written (local)."""
    root = project.root / "checkpoints"
    with ka.Run("heat", root=root, seed=3, every=ka.EverySteps(1), keep=3) as r:
        for step in r.steps(4):
            r.checkpoint(step, {"u": r.rng.random((8, 8))})
    run_dir = root / "heat"
    assert not (run_dir / checkpoint_name(1)).exists()
    (run_dir / checkpoint_name(2)).unlink()
    altered = run_dir / checkpoint_name(3)
    data = bytearray(altered.read_bytes())
    data[-1] ^= 0xFF  # the same size: hashed, and found not to be the signed bytes
    altered.write_bytes(bytes(data))
    return run_dir


def json_of(*args: str, code: int) -> Any:
    result = run_cli(*args)
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


def test_every_command_says_where_the_data_is_in_the_same_words(
    run_dir: Path, tmp_path: Path
) -> None:
    status = json_of("status", "--json", str(run_dir), code=1)  # step 3 is corrupt
    by_status = {c["step"]: c["location"] for c in status["checkpoints"]}
    assert by_status == {1: "pruned", 2: "missing", 3: "corrupt", 4: "local"}
    assert set(status["counts"]) <= WORDS

    # log hashes nothing: the altered step is here, so local
    (logged,) = json_of("log", "--json", str(run_dir), code=0)["runs"]
    assert logged["data"] == {"local": 2, "pruned": 1, "missing": 1}
    assert set(logged["data"]) <= WORDS

    verified = json_of("verify", "--json", "--no-fetch", str(run_dir), code=2)
    by_verify = {r["step"]: r["data"] for r in verified["results"]}
    assert by_verify == {1: "pruned", 3: "corrupt", 4: "local"}
    (error,) = verified["errors"]  # a missing checkpoint is bad input, as before
    assert error["path"] == str(run_dir / checkpoint_name(2))

    out = tmp_path / "report.json"
    reported = run_cli("report", str(run_dir), "--no-fetch", "--newest", "4", "--out", str(out))
    assert reported.exit_code == 1, reported.output
    (run,) = json.loads(out.read_text())["runs"]
    rows = [*run["verification"]["newest"], *run["verification"]["failures"]]
    by_report = {r["step"]: r["data"] for r in rows}
    assert by_report == {1: "pruned", 3: "corrupt", 4: "local"}

    # where two commands looked, they agree
    for step, word in by_verify.items():
        assert by_status[step] == by_report[step] == word, step


def test_the_text_outputs_use_the_words(run_dir: Path, tmp_path: Path) -> None:
    logged = run_cli("log", str(run_dir))
    assert "  data        2 local, 1 pruned, 1 missing" in logged.stdout.splitlines()
    status = run_cli("status", str(run_dir))
    assert "1 corrupt, 1 local, 1 missing, 1 pruned" in status.stdout.splitlines()
    markdown = tmp_path / "report.md"
    reported = run_cli("report", str(run_dir), "--no-fetch", "--out", str(markdown))
    assert reported.exit_code == 1, reported.output
    rows = [line for line in markdown.read_text().splitlines() if "step-0000000" in line]
    newest = [line.rsplit("|", 2)[1].strip() for line in rows if line.count("|") == 6]
    assert newest == ["local", "corrupt", "pruned"]  # newest first
    html = tmp_path / "report.html"
    assert run_cli("report", str(run_dir), "--no-fetch", "--out", str(html)).exit_code == 1
    page = html.read_text()
    for word in ("local", "corrupt", "pruned"):
        assert f"<td>{word}</td>" in page


def test_with_the_remote_asked_log_says_what_status_says(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    from kronos_audit.storage import Storage, configure_remote

    root = project.root / "checkpoints"
    with ka.Run("heat", root=root, seed=3, every=ka.EverySteps(1)) as r:
        for step in r.steps(3):
            r.checkpoint(step, {"u": r.rng.random((8, 8))})
    run_dir = root / "heat"
    remote = tmp_path / "remote"
    remote.mkdir()
    configure_remote(project, str(remote), "storage")
    assert run_cli("push", str(run_dir)).exit_code == 0
    discard(Storage(project), run_dir / checkpoint_name(2))  # remote-only
    (run_dir / checkpoint_name(3)).unlink()  # remote-only
    (logged,) = json_of("log", "--json", "--remote", str(run_dir), code=0)["runs"]
    status = json_of("status", "--json", str(run_dir), code=0)
    assert logged["data"] == status["counts"] == {"pushed": 1, "remote-only": 2}
    # fetched by verify, its bytes checked: here now
    verified = json_of("verify", "--json", str(run_dir), code=0)
    assert {r["step"]: (r["data"], r["fetched"]) for r in verified["results"]} == {
        1: ("local", False),
        2: ("local", True),
        3: ("local", True),
    }


def test_data_not_looked_at_has_no_word(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    with ka.Run("heat", root=root, seed=3, every=ka.EverySteps(1)) as r:
        for step in r.steps(1):
            r.checkpoint(step, {"u": r.rng.random((8, 8))})
    manifest = root / "heat" / (checkpoint_name(1) + ".kaudit.json")
    verifier = Verifier(project, load_keyring(project.root))
    assert verifier.verify(manifest, data=False).data is None
    assert verifier.verify(manifest).data is Location.LOCAL
    (result,) = verify(manifest, fetch=False)
    assert result.to_json_obj()["data"] == "local"


def test_the_report_schema_allows_exactly_the_words() -> None:
    schema = json.loads(SCHEMA.read_text())
    data = schema["$defs"]["manifest_row"]["properties"]["data"]
    assert set(data["enum"]) == {*WORDS, None}
    assert "data" in schema["$defs"]["manifest_row"]["required"]
