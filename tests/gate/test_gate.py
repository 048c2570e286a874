"""`kaudit gate` on real runs: a reproducible example passes; a tampered manifest, a
segment that does not reproduce and a change that trusts its own key fail (exit 1, each
failure named in the JUnit XML); a gate weakened in the work tree is ignored under
--trust-ref; the Markdown summary; required signers; bad configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kronos_audit.gate import Segment, sample
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.gate.helpers import gate_json, junit_cases, problems, set_gate
from tests.helpers import assert_bad_input, git, run_cli
from tests.replay import recorded
from tests.replay.helpers import commit_all, manifest, record, resign

pytestmark = pytest.mark.slow

# The fixtures over the repository recorded once for the session (tests/replay/recorded.py).
heat = recorded.heat
key = recorded.key
project = recorded.project
repo = recorded.repo


HEAT = "heat/checkpoints/heat"


def test_a_reproducible_run_passes(heat: Path, repo: Path, tmp_path: Path) -> None:
    junit = tmp_path / "gate.xml"
    result = run_cli("gate", "--junit", str(junit), cwd=repo)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "gate PASSED"
    assert "3 of 3 manifests verified, 1 of 1 segments reproduced" in result.stdout
    cases = junit_cases(junit)
    assert sorted(cases) == [
        f"replay.heat/{HEAT}/step-00000030.h5.kaudit.json",  # the newest segment
        *(f"verify.heat/{HEAT}/step-{s:08d}.h5.kaudit.json" for s in (10, 20, 30)),
    ]
    assert all(c.is_passed for c in cases.values())
    doc = gate_json(repo)
    assert doc["verdict"] == "PASSED"
    assert doc["counts"] == {
        "verify": {"passed": 3, "failed": 0, "error": 0},
        "replay": {"passed": 1, "failed": 0, "error": 0},
    }
    assert doc["config"]["source"].startswith("default")


def test_a_tampered_manifest_fails_and_is_named(heat: Path, repo: Path, tmp_path: Path) -> None:
    target = manifest(heat, 20)
    obj = json.loads(target.read_text())
    obj["signatures"][0]["sig"] = obj["signatures"][0]["sig"][:-8] + "AAAAAAA="
    target.write_text(json.dumps(obj))
    junit = tmp_path / "gate.xml"
    result = run_cli("gate", "--junit", str(junit), cwd=repo)
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[-1] == "gate FAILED"
    assert f"{HEAT}/step-00000020.h5.kaudit.json" in result.stdout
    cases = junit_cases(junit)
    bad = cases[f"verify.heat/{HEAT}/step-00000020.h5.kaudit.json"]
    ((what, message, _),) = problems(bad)
    assert what == "failure"
    assert message.startswith("signature:")
    # its child's link to it breaks, and that segment cannot be replayed
    ((what, message, _),) = problems(cases[f"verify.heat/{HEAT}/step-00000030.h5.kaudit.json"])
    assert what == "failure"
    assert message.startswith("parent link:")
    ((what, message, _),) = problems(cases[f"replay.heat/{HEAT}/step-00000030.h5.kaudit.json"])
    assert what == "error"
    assert "parent" in message
    assert not message.startswith("/")  # paths relative to the repository
    assert [n for n, c in cases.items() if c.is_passed] == [
        f"verify.heat/{HEAT}/step-00000010.h5.kaudit.json"
    ]


def test_a_segment_that_does_not_reproduce_fails_naming_the_dataset(
    repo: Path, tmp_path: Path
) -> None:
    record(repo, "programs", "noisy.py", "10")
    junit = tmp_path / "gate.xml"
    doc = gate_json(repo, "--junit", str(junit), exit_code=1)
    (failure,) = doc["failures"]
    assert failure["kind"] == "replay"
    assert failure["name"] == "programs/checkpoints/noisy/step-00000010.h5.kaudit.json"
    assert failure["message"] == "NOT REPRODUCED: /noise"
    cases = junit_cases(junit)
    replayed = cases["replay.noisy/programs/checkpoints/noisy/step-00000010.h5.kaudit.json"]
    ((what, message, text),) = problems(replayed)
    assert (what, message) == ("failure", "NOT REPRODUCED: /noise")
    assert "/noise: DIFFERENT" in text
    assert sum(c.is_passed for c in cases.values()) == 2  # both manifests verify


def test_a_change_that_trusts_its_own_key_fails_against_the_base_branch(
    heat: Path, repo: Path, project: Project, mallory: SigningKey, tmp_path: Path
) -> None:
    # The change under review: mallory's key in the repository's store, and a result
    # mallory signed (here: the newest manifest, with a step count of their liking).
    project.trust_store().add(mallory.private_key.public_key(), "mallory")
    resign(manifest(heat, 30), mallory, lambda p: p.update(restart_count=7))
    git(repo, "checkout", "-q", "-b", "change")
    commit_all(repo, "trust me")
    gate_json(repo, exit_code=1)  # the work tree's own store is no anchor by default
    everyday = gate_json(repo, "--allow-unanchored")  # ...unless the verifier says so
    assert everyday["counts"]["verify"]["passed"] == 3
    junit = tmp_path / "gate.xml"
    doc = gate_json(repo, "--trust-ref", "main", "--junit", str(junit), exit_code=1)
    names = {f["name"] for f in doc["failures"] if f["kind"] == "verify"}
    assert names == {f"{HEAT}/step-00000030.h5.kaudit.json"}
    cases = junit_cases(junit)
    ((what, message, _),) = problems(cases[f"verify.heat/{HEAT}/step-00000030.h5.kaudit.json"])
    assert what == "failure"
    assert message.startswith("signature:")
    assert cases[f"verify.heat/{HEAT}/step-00000020.h5.kaudit.json"].is_passed


def test_a_gate_weakened_in_the_work_tree_is_ignored_under_trust_ref(repo: Path) -> None:
    record(repo, "programs", "noisy.py", "10")
    set_gate(repo, "segments = 1\nseed = 3")
    commit_all(repo, "the protected gate")
    # the change under review turns replay off, and would accept anything
    set_gate(repo, 'segments = 0\nrtol = 1e300\ntol = ["*:rtol=1e300"]')
    weakened = gate_json(repo)
    assert weakened["counts"]["replay"] == {"passed": 0, "failed": 0, "error": 0}
    assert weakened["config"]["segments"] == 0
    doc = gate_json(repo, "--trust-ref", "main", exit_code=1)
    main = git(repo, "rev-parse", "main").strip()
    assert doc["config"]["source"] == f"refs/heads/main at {main}:.kaudit/config.toml"
    assert doc["trust_ref_resolved"] == {"given": "main", "ref": "refs/heads/main", "commit": main}
    assert doc["config"]["segments"] == 1
    assert doc["config"]["policy"] == {"rules": [], "default": None}
    assert [f["message"] for f in doc["failures"]] == ["NOT REPRODUCED: /noise"]


def test_the_markdown_summary_is_appended_to_github_step_summary(
    heat: Path, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert run_cli("gate", cwd=repo).exit_code == 0
    text = summary.read_text()
    assert text.startswith("# earlier step\n# ✅ kaudit gate: PASSED\n")
    assert "| manifests verified | 3 | 0 | 0 |" in text
    assert "| segments replayed | 1 | 0 | 0 |" in text
    # then, folded, the auditor's report of the runs gated (kaudit report's Markdown)
    assert "<details><summary>kaudit report of the runs gated</summary>" in text
    assert "# kaudit report: PASS" in text
    # a failure is listed, its name escaped as Markdown text
    target = manifest(heat, 10)
    target.write_text(target.read_text().replace('"sig": "', '"sig": "AAAA', 1))
    assert run_cli("gate", cwd=repo).exit_code == 1
    failed = summary.read_text()[len(text) :]
    assert failed.startswith("# ❌ kaudit gate: FAILED\n")
    assert "## Failures" in failed
    assert "step-00000010.h5.kaudit.json" in failed


def test_a_run_judged_with_its_own_tolerance_says_so_and_why(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(repo, "programs", "order.py", "10")
    order = "programs/checkpoints/order"
    why = "sums its terms in an order the environment chooses"
    set_gate(repo, f'segments = 1\n[gate.tolerance."{order}"]\nrtol = 1e-9\nwhy = "{why}"')
    commit_all(repo, "the order run, judged with a tolerance")
    monkeypatch.setenv("KAUDIT_TEST_ORDER", "reverse")  # the replay sums backwards
    doc = gate_json(repo, "--trust-ref", "main")
    (case,) = [c for c in doc["cases"] if c["kind"] == "replay"]
    assert case["message"].startswith("REPRODUCED WITHIN TOLERANCE: ")
    assert case["message"].endswith(
        f"; judged with a tolerance: {order} (rtol=1e-09,atol=0): {why}"
    )
    assert doc["config"]["tolerances"] == [
        {
            "pattern": order,
            "policy": {"default": {"rtol": 1e-9, "atol": 0.0, "ulp": None}, "rules": []},
            "why": why,
        }
    ]
    text = run_cli("gate", "--trust-ref", "main", cwd=repo)
    assert text.exit_code == 0, text.output
    assert f"judged with a tolerance: {order} (rtol=1e-09,atol=0): {why}" in text.stdout
    # The tolerance is the protected ref's: removed in the work tree, it still judges...
    set_gate(repo, "segments = 1")
    assert gate_json(repo, "--trust-ref", "main")["ok"]
    # ...and without it the run is judged bitwise, and fails.
    doc = gate_json(repo, exit_code=1)
    assert [f["message"] for f in doc["failures"]] == ["NOT REPRODUCED: /total"]
    # A tolerance added in the work tree alone does not pass a protected gate.
    commit_all(repo, "no tolerance")
    set_gate(repo, f'segments = 1\n[gate.tolerance."{order}"]\nrtol = 1e-3\nwhy = "x"')
    gate_json(repo, "--trust-ref", "main", exit_code=1)


def test_sampling_is_reproducible_from_the_seed_and_includes_the_newest() -> None:
    run_a = [Segment("a", s, Path(f"a/step-{s}.kaudit.json")) for s in range(1, 101)]
    run_b = [Segment("b", s, Path(f"b/step-{s}.kaudit.json")) for s in range(5, 50, 5)]
    first = sample(run_a + run_b, 4, seed=11)
    assert first == sample(list(reversed(run_b + run_a)), 4, seed=11)  # order-free
    assert len(first) == 8
    assert {s.step for s in first if s.run == "a"} >= {100}
    assert {s.step for s in first if s.run == "b"} >= {45}
    others = {sample(run_a, 4, seed=seed) for seed in range(20)}
    assert len(others) > 1  # the seed draws the others
    assert all(max(s.step for s in o) == 100 for o in others)
    assert sample(run_a, 4, seed=11) == tuple(s for s in first if s.run == "a")  # per run
    assert sample(run_a, 0, seed=1) == ()
    assert len(sample(run_b, 100, seed=1)) == len(run_b)
    # A sharded run's steps are one run, each step's manifest in its own directory.
    sharded = [
        Segment("m", s, Path(f"m/step-{s:08d}/index.jsonl.kaudit.json")) for s in (10, 20, 30)
    ]
    assert [s.step for s in sample(sharded, 1, seed=3)] == [30]


def test_a_sample_of_segments_from_the_configured_seed(heat: Path, repo: Path) -> None:
    set_gate(repo, "segments = 2\nseed = 5")
    doc = gate_json(repo)
    replayed = [c["step"] for c in doc["cases"] if c["kind"] == "replay"]
    assert len(replayed) == 2
    assert 30 in replayed
    again = gate_json(repo)
    assert [c["step"] for c in again["cases"] if c["kind"] == "replay"] == replayed


def test_required_signers(heat: Path, repo: Path, key: SigningKey) -> None:
    set_gate(repo, 'segments = 0\nsigners = ["tester"]')
    gate_json(repo)
    set_gate(repo, f'segments = 0\nsigners = ["{key.key_id[:16]}"]')
    gate_json(repo)
    set_gate(repo, 'segments = 0\nsigners = ["release-bot"]')
    doc = gate_json(repo, exit_code=1)
    assert len(doc["failures"]) == 3
    assert all("not one of release-bot" in f["message"] for f in doc["failures"])


def test_bad_configuration_is_one_line(heat: Path, repo: Path) -> None:
    set_gate(repo, "segments = -1")
    assert_bad_input(run_cli("gate", cwd=repo), "[gate] segments")
    set_gate(repo, 'runs = ["nowhere/*"]')
    assert_bad_input(run_cli("gate", cwd=repo), "matches no manifest")
    set_gate(repo, 'env = "loose"')
    assert_bad_input(run_cli("gate", cwd=repo), "[gate] env")
    set_gate(repo, 'tol = ["fields/*:rtol=abc"]')
    assert_bad_input(run_cli("gate", cwd=repo), "[gate] tol[0]")
    set_gate(repo, "colour = 1")
    assert_bad_input(run_cli("gate", cwd=repo), "unknown key 'colour'")
    set_gate(repo, '[gate.tolerance."heat/*"]\nrtol = 1e-9')
    assert_bad_input(run_cli("gate", cwd=repo), "[gate.tolerance.'heat/*']: why")
    set_gate(repo, '[gate.tolerance."heat/*"]\nwhy = "because"')
    assert_bad_input(run_cli("gate", cwd=repo), "no tolerance")
    set_gate(repo, '[gate.tolerance."../elsewhere"]\nrtol = 1e-9\nwhy = "because"')
    assert_bad_input(run_cli("gate", cwd=repo), "inside the repository")
    set_gate(repo, '[gate.tolerance."heat/*"]\natol = 1e-9\nwhy = "x"\nskip = true')
    assert_bad_input(run_cli("gate", cwd=repo), "unknown key 'skip'")
    set_gate(repo, "")
    assert_bad_input(run_cli("gate", "--trust-ref", "no-such-branch", cwd=repo), "no-such-branch")
    result = run_cli("gate", "--json", "--trust-ref", "no-such-branch", cwd=repo)
    assert result.exit_code == 2
    assert json.loads(result.stdout)["exit_code"] == 2


def test_no_manifest_at_all_is_bad_input(repo: Path) -> None:
    assert_bad_input(run_cli("gate", cwd=repo), "no manifest")


def test_quiet_prints_failures_and_the_verdict_verbose_every_case(heat: Path, repo: Path) -> None:
    set_gate(repo, "segments = 1")
    verbose = run_cli("-v", "gate", cwd=repo)
    assert verbose.exit_code == 0, verbose.output
    listed = [line for line in verbose.stdout.splitlines() if line.startswith("ok ")]
    assert listed == [
        *(f"ok verify {HEAT}/step-{s:08d}.h5.kaudit.json" for s in (10, 20, 30)),
        f"ok replay {HEAT}/step-00000030.h5.kaudit.json",
    ]
    quiet = run_cli("-q", "gate", cwd=repo)
    assert quiet.exit_code == 0
    assert quiet.stdout == quiet.stderr == ""  # as `git commit -q`: nothing on success
    target = manifest(heat, 10)
    target.write_text(target.read_text().replace('"sig": "', '"sig": "AAAA', 1))
    failed = run_cli("-q", "gate", cwd=repo).stdout.splitlines()
    assert failed[0] == f"FAILED verify {HEAT}/step-00000010.h5.kaudit.json"
    assert failed[-1] == "gate FAILED"
    assert not any("manifests verified" in line for line in failed)
