"""A signed verdict depends only on signed or given settings: the tolerances of
`kaudit replay --attest` come from the command line or from [compare] at a trust ref,
never from the work tree's config; the attestation records the comparison it used, and
verify, show, report and the gate print it. The pytest plugin and bisect are not loosened
by the work tree either."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from kronos_audit.errors import UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.pytest_plugin import KauditChecks
from kronos_audit.replay import read_attestation, replay, write_attestation
from tests.helpers import git, run_cli
from tests.replay.helpers import commit_all, manifest, record

pytestmark = pytest.mark.slow

LOOSE = "\n[compare]\natol = 1e300\n"
"""What the attacker commits: any float dataset agrees with anything."""
FAIR = "\n[compare]\nrtol = 1e-9\n"
"""What the protected branch holds: the summation order's rounding, and no more."""


def config(repo: Path) -> Path:
    return repo / ".kaudit" / "config.toml"


@pytest.fixture
def order(repo: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The summation program recorded (forward), and a protected branch at that commit;
    the replay then sums in reverse, so /total differs from the record in its last bits."""
    record(repo, "programs", "order.py", "10", env={"KAUDIT_TEST_ORDER": "forward"})
    commit_all(repo)
    git(repo, "branch", "protected")
    monkeypatch.setenv("KAUDIT_TEST_ORDER", "reverse")
    return manifest(repo / "programs" / "checkpoints" / "order", 10)


def commit_config(repo: Path, text: str, message: str) -> None:
    with config(repo).open("a") as f:
        f.write(text)
    commit_all(repo, message)


def tolerances(predicate: Mapping[str, Any]) -> Mapping[str, Any]:
    recorded = predicate["tolerances"]
    assert isinstance(recorded, Mapping)
    return recorded


def test_a_committed_tolerance_does_not_loosen_a_signed_verdict(repo: Path, order: Path) -> None:
    commit_config(repo, LOOSE, "loosen the comparison")
    result = run_cli("replay", str(order), "--attest", "--json")
    assert result.exit_code == 1, result.output  # NOT REPRODUCED, as it is
    assert "not used for a signed verdict" in result.stderr
    attestation = read_attestation(order.with_name("step-00000010.h5.replay.json"))
    assert attestation.outcome == "NOT_REPRODUCED"
    predicate = attestation.predicate
    assert predicate["policy"] == {"default": None, "rules": []}
    recorded = tolerances(predicate)
    assert recorded["source"] == {"settings": "none", "config": None, "given": False}
    rows = {d["path"]: d for d in recorded["datasets"]}
    assert rows["/total"] == {
        "path": "/total",
        "tolerance": None,
        "rule": "bitwise (the recorded hashes)",
    }
    # verify fails it, and says what it was compared with
    verified = run_cli("verify", str(attestation.path))
    assert verified.exit_code == 1
    assert "compared: exact (bitwise) (no tolerance given or configured)" in verified.stdout


def test_a_trust_ref_decides_the_tolerance_and_the_work_tree_does_not(
    repo: Path, order: Path
) -> None:
    # The protected branch allows the rounding of a summation order; the change under
    # review, on top, allows anything.
    commit_config(repo, FAIR, "allow the rounding")
    git(repo, "branch", "-f", "protected")
    commit_config(repo, LOOSE, "loosen the comparison")
    result = run_cli("replay", str(order), "--attest", "--trust-ref", "protected", "--json")
    assert result.exit_code == 0, result.output
    path = order.with_name("step-00000010.h5.replay.json")
    attestation = read_attestation(path)
    assert attestation.outcome == "REPRODUCED_WITHIN_TOLERANCE"
    predicate = attestation.predicate
    assert predicate["policy"]["default"] == {"rtol": 1e-9, "atol": 0.0, "ulp": None}
    recorded = tolerances(predicate)
    source = recorded["source"]
    assert source["settings"] == "trust-ref"
    assert source["config"].startswith("refs/heads/protected at ")
    assert source["config"].endswith(":.kaudit/config.toml")
    assert not source["given"]
    total = next(d for d in recorded["datasets"] if d["path"] == "/total")
    assert total["tolerance"] == {"rtol": 1e-9, "atol": 0.0, "ulp": None}
    assert total["rule"] == "global rtol=1e-09,atol=0"

    line = "/total: rtol=1e-09,atol=0 (global rtol=1e-09,atol=0)"
    # kaudit verify names the tolerance, and the ref it was read at
    verified = run_cli("verify", str(path))
    assert verified.exit_code == 0, verified.output
    assert "compared: float data rtol=1e-09,atol=0 ([compare] at refs/heads/protected at" in (
        verified.stdout
    )
    assert line in verified.stdout
    as_json = json.loads(run_cli("verify", str(path), "--json").stdout)
    (entry,) = [r for r in as_json["results"] if r["kind"] == "attestation"]
    assert line in entry["comparison"]
    # kaudit show, unverified, says the same
    shown = run_cli("show", str(path))
    assert shown.exit_code == 0, shown.output
    assert "REPRODUCED_WITHIN_TOLERANCE" in shown.stdout
    assert "float data rtol=1e-09,atol=0 ([compare] at refs/heads/protected" in shown.stdout
    assert line in shown.stdout
    # the report, in Markdown and HTML
    md = repo / "report.md"
    made = run_cli("report", str(order.parent), "--out", str(md))
    assert made.exit_code == 0, made.output
    text = md.read_text()
    assert "compared: float data rtol=1e-09,atol=0" in text
    assert line in text
    html = repo / "report.html"
    assert run_cli("report", str(order.parent), "--out", str(html)).exit_code == 0
    assert "Compared: float data rtol=1e-09,atol=0" in html.read_text()
    # the gate, which verifies the attestation among the manifests
    gated = run_cli("gate", "--trust-ref", "protected", cwd=repo)
    assert f"attestation programs/checkpoints/order/{path.name} compared: float data" in (
        gated.stdout
    )
    assert line in gated.stdout


def test_no_tolerance_at_the_trust_ref_is_bitwise_whatever_the_work_tree_says(
    repo: Path, order: Path
) -> None:
    commit_config(repo, LOOSE, "loosen the comparison")
    result = run_cli("replay", str(order), "--attest", "--trust-ref", "protected", "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["outcome"] == "NOT_REPRODUCED"
    assert doc["policy"] == {"default": None, "rules": []}


def test_an_unsigned_replay_uses_the_work_tree_and_says_so(repo: Path, order: Path) -> None:
    commit_config(repo, FAIR, "allow the rounding")
    result = run_cli("replay", str(order))
    assert result.exit_code == 0, result.output
    assert "REPRODUCED WITHIN TOLERANCE" in result.stdout
    assert (
        "float data rtol=1e-09,atol=0  ([compare] of the work tree's .kaudit/config.toml, "
        "not a trust ref)" in result.stdout
    )
    doc = json.loads(run_cli("replay", str(order), "--json").stdout)
    assert doc["tolerances"]["source"] == {
        "settings": "work-tree",
        "config": ".kaudit/config.toml",
        "given": False,
    }


def test_command_line_tolerances_are_recorded_as_given(repo: Path, order: Path) -> None:
    commit_config(repo, LOOSE, "loosen the comparison")
    result = run_cli("replay", str(order), "--attest", "--rtol", "1e-9", "--json")
    assert result.exit_code == 0, result.output
    attestation = read_attestation(order.with_name("step-00000010.h5.replay.json"))
    # the work tree's atol is not layered under the command line's rtol
    assert attestation.predicate["policy"]["default"] == {"rtol": 1e-9, "atol": 0.0, "ulp": None}
    assert tolerances(attestation.predicate)["source"] == {
        "settings": "none",
        "config": None,
        "given": True,
    }


def test_the_library_signs_no_work_tree_tolerance(repo: Path, order: Path, key: SigningKey) -> None:
    commit_config(repo, LOOSE, "loosen the comparison")
    result = replay(order)  # policy None: [compare] of the work tree, recorded as such
    assert result.policy_source.settings == "work-tree"
    target = order.with_name("step-00000010.h5.replay.json")
    with pytest.raises(UsageError, match=r"not from the work tree's \.kaudit/config\.toml"):
        write_attestation(result, key, target)
    assert not target.exists()


def test_the_pytest_plugin_is_not_loosened_by_the_work_tree(repo: Path, order: Path) -> None:
    commit_config(repo, LOOSE, "loosen the comparison")
    checks = KauditChecks()
    with pytest.raises(AssertionError) as failed:
        checks.assert_replays(order)
    said = str(failed.value)
    assert "/total: DIFFERENT" in said
    assert "is not read by a test" in said
    # at a protected ref that allows the rounding, it passes, and says where from
    git(repo, "checkout", "-q", "protected")
    commit_config(repo, FAIR, "allow the rounding")  # moves the branch checked out
    git(repo, "checkout", "-q", "-")
    result = checks.assert_replays(order, trust_ref="protected")
    assert result.outcome == "REPRODUCED_WITHIN_TOLERANCE"
    assert result.policy_source.settings == "trust-ref"
    assert result.policy.default is not None
    assert result.policy.default.atol == 0.0


def test_bisect_reads_tolerances_at_the_trust_ref_and_says_where_from(
    repo: Path, order: Path
) -> None:
    # the same program summing in the other order, recorded as a second run
    other = repo / "reverse"
    other.mkdir()
    shutil.copy(repo / "programs" / "order.py", other / "order.py")
    record(repo, "reverse", "order.py", "10", env={"KAUDIT_TEST_ORDER": "reverse"})
    commit_config(repo, LOOSE, "loosen the comparison")
    a = str(order.parent)
    b = str(other / "checkpoints" / "order")
    loose = run_cli("bisect", a, b)
    assert loose.exit_code == 0, loose.output
    assert "([compare] of the work tree's .kaudit/config.toml, not a trust ref)" in loose.stdout
    doc = json.loads(run_cli("bisect", a, b, "--json").stdout)
    assert doc["tolerance_source"]["settings"] == "work-tree"
    protected = run_cli("bisect", a, b, "--trust-ref", "protected")
    assert protected.exit_code == 1, protected.output
    assert "DIVERGED at step 5" in protected.stdout
    assert "exact (bitwise) (no tolerance given or configured)" in protected.stdout
