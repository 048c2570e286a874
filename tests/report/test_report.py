"""`kaudit report`: the auditor's report of a real run with a real replay attestation, in
HTML, Markdown and JSON (the JSON valid against schemas/report-v1.schema.json)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import jsonschema
import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.report import Verdict, build_report, render_html, render_markdown, report_json
from tests.helpers import run_cli
from tests.replay import recorded
from tests.replay.helpers import manifest, resign

# The fixtures over the repository recorded once for the session (tests/replay/recorded.py).
heat = recorded.heat
key = recorded.key
project = recorded.project
repo = recorded.repo

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "schemas" / "report-v1.schema.json").read_text()
)


@pytest.fixture
def attested(heat: Path) -> Path:
    """The heat run (steps 10, 20, 30) with step 20 replayed and attested; its directory."""
    assert (heat / "step-00000020.h5.replay.json").is_file()
    return heat


def test_three_formats_of_a_run_with_a_replay_attestation(attested: Path, tmp_path: Path) -> None:
    for ext in ("html", "md", "json"):
        result = run_cli("report", str(attested), "--out", str(tmp_path / f"r.{ext}"))
        assert result.exit_code == 0, result.output
        assert "PASS report written to" in result.stdout

    document = json.loads((tmp_path / "r.json").read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(document)
    assert document["verdict"] == "PASS"
    (run,) = document["runs"]
    assert run["run"] == "heat"
    assert run["verification"] == {
        **run["verification"],
        "total": 3,
        "passed": 3,
        "failed": 0,
    }
    assert [p["step"] for p in run["chain"]["points"]] == [10, 20, 30]
    (signer,) = run["signers"]
    assert (signer["name"], signer["count"]) == ("tester", 3)
    (replay,) = run["replays"]
    assert (replay["step"], replay["verified"], replay["outcome"]) == (20, True, "REPRODUCED")
    assert replay["resumed_from"] == 10
    assert {d["path"] for d in replay["datasets"]} >= {"/fields/u"}
    assert all(d["verdict"] == "IDENTICAL" for d in replay["datasets"])
    assert (run["replays_total"], run["replays_verified"]) == (1, 1)
    assert run["code"][0]["patch_applied"] is False
    assert any(c.startswith("kaudit verify heat/checkpoints/heat") for c in run["reproduce"])
    assert any(c.startswith("kaudit replay ") for c in run["reproduce"])

    md = (tmp_path / "r.md").read_text()
    assert md.splitlines()[0] == "# kaudit report: PASS"
    for expected in ("REPRODUCED", "/fields/u", "kaudit verify heat/checkpoints/heat"):
        assert expected in md

    html = (tmp_path / "r.html").read_text()
    assert "1 of 1 replay attestations verify" in html
    assert html.index('id="verdict"') < html.index("Provenance")
    assert "<svg" in html
    assert "REPRODUCED" in html
    # self-contained: nothing is loaded from anywhere
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "@import" not in html
    assert "url(" not in html


def test_a_failing_verification_is_fail_in_every_format(
    attested: Path, key: SigningKey, tmp_path: Path
) -> None:
    resign(manifest(attested, 30), key, lambda p: p.update(step=31))
    report = build_report([attested])
    assert report.verdict is Verdict.FAIL
    md = render_markdown(report)
    assert md.splitlines()[0] == "# kaudit report: FAIL"
    assert "**FAIL**" in md
    html = render_html(report)
    assert 'class="verdict fail"' in html
    assert ">FAIL<" in html
    document = report_json(report)
    assert document["verdict"] == "FAIL"
    assert document["runs"][0]["verification"]["failed"] >= 1
    assert document["runs"][0]["verification"]["failures"][0]["ok"] is False
    result = run_cli("report", str(attested), "--out", str(tmp_path / "r.md"))
    assert result.exit_code == 1
    assert (tmp_path / "r.md").read_text().startswith("# kaudit report: FAIL")


def test_hostile_names_are_text(project: Project, key: SigningKey, tmp_path: Path) -> None:
    import kronos_audit as ka
    from tests.helpers import write_checkpoint

    ckpt = write_checkpoint(project.root / "checkpoints" / "x" / "step-00000001.h5")
    hostile = "<script>alert(1)</script>[x](javascript:alert(2))|`*"
    ka.snapshot(ckpt, run=hostile, step=1, key=key)
    report = build_report([ckpt.parent])
    html = render_html(report)
    assert "<script>alert(1)" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.count("<script>") == 1  # the page's own
    md = render_markdown(report)
    assert "<script>" not in md
    assert "[x](" not in md  # not a link
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\[x\\](javascript:alert(2))\\|\\`\\*" in md
    assert report_json(report)["runs"][0]["run"] == hostile


def test_a_chain_of_1000_renders_small_and_aggregated(chain_1000: Path, tmp_path: Path) -> None:
    t0 = time.perf_counter()
    report = build_report([chain_1000])
    html = render_html(report)
    elapsed = time.perf_counter() - t0
    assert len(html.encode()) < 2 * 1024 * 1024
    (run,) = report.runs
    assert run.verification.total == 1000
    assert run.ok
    assert len(run.verification.newest) == 10
    assert html.count("<tr>") < 100  # aggregated: not a row per checkpoint
    kinds = [g.kind.value for g in run.chain.gaps]
    assert kinds == ["restart", "pause"]
    assert run.chain.restarts == 1
    assert html.count("<polyline") == 3  # the restart breaks the timeline; sizes are one line
    jsonschema.Draft202012Validator(SCHEMA).validate(report_json(report))
    md = render_markdown(report)
    assert md.count("\n| ") < 40
    print(f"1,000 checkpoints: {elapsed:.2f} s, {len(html) / 1024:.0f} KiB of HTML")


def test_unreadable_manifests_fail_the_report_and_stay_few_in_the_verdict(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    import kronos_audit as ka
    from tests.helpers import write_checkpoint

    ckpt = write_checkpoint(project.root / "checkpoints" / "x" / "step-00000001.h5")
    ka.snapshot(ckpt, run="x", step=1, key=key)
    for step in range(2, 62):
        (ckpt.parent / f"step-{step:08d}.h5.kaudit.json").write_text("{not json")
    report = build_report([ckpt.parent])
    assert report.verdict is Verdict.FAIL
    assert len(report.problems) == 60
    assert len(report.reasons) == 11
    assert report.reasons[-1] == "... and 50 more unreadable inputs"
    assert report.runs[0].verification.total == 1
    assert "... and 10 more" in render_html(report)
    md = render_markdown(report)
    assert md.startswith("# kaudit report: FAIL\n")
    assert "- ... and 10 more" in md
    jsonschema.Draft202012Validator(SCHEMA).validate(report_json(report))


def test_replays_are_counted_and_only_failures_and_the_newest_listed(attested: Path) -> None:
    (run,) = build_report([attested], newest=0).runs
    assert (run.replays_total, run.replays_verified, run.replays) == (1, 1, ())
    assert run.verification.newest == ()
    assert "1 of 1 replay attestation verify; 0 listed" in render_markdown(
        build_report([attested], newest=0)
    )


def test_a_recorded_command_cannot_add_a_line_to_the_commands(heat: Path, key: SigningKey) -> None:
    resign(manifest(heat, 30), key, lambda p: p.update(command=["python", "run.py\ntouch pwned"]))
    (run,) = build_report([heat]).runs
    assert run.ok
    assert run.reproduce[-1].startswith("# the recorded command")
    assert "touch pwned" in run.reproduce[-1]
    assert all("\n" not in command for command in run.reproduce)
