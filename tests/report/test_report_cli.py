"""`kaudit report` as a command: the format from the extension or --format, the trust
options applied to the verification it shows, a replay that did not reproduce, bad input."""

from __future__ import annotations

import json
from pathlib import Path

from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from tests.helpers import assert_bad_input, run_cli, untrusted_key, write_checkpoint
from tests.replay.helpers import manifest, record


def snapshot_one(project: Project, key: SigningKey) -> Path:
    import kronos_audit as ka

    ckpt = write_checkpoint(project.root / "checkpoints" / "one" / "step-00000001.h5")
    ka.snapshot(ckpt, run="one", step=1, key=key)
    return ckpt.parent


def test_format_option_overrides_the_extension(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    run_dir = snapshot_one(project, key)
    out = tmp_path / "summary.html"
    result = run_cli("report", str(run_dir), "--out", str(out), "--format", "md", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "out": str(out),
        "format": "md",
        "verdict": "PASS",
        "ok": True,
        "reasons": ["run one: all 1 manifests verify, no replay attested"],
    }
    assert out.read_text().startswith("# kaudit report: PASS\n")


def test_with_no_path_the_report_covers_every_run_of_the_repository(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    import kronos_audit as ka

    snapshot_one(project, key)
    other = write_checkpoint(project.root / "elsewhere" / "two" / "step-00000001.h5", seed=2)
    ka.snapshot(other, run="two", step=1, key=key)
    out = tmp_path / "report.json"
    result = run_cli("report", "--out", str(out), "--json", cwd=project.root / "elsewhere")
    assert result.exit_code == 0, result.output
    assert sorted(json.loads(result.stdout)["reasons"]) == [
        "run one: all 1 manifests verify, no replay attested",
        "run two: all 1 manifests verify, no replay attested",
    ]


def test_an_unknown_extension_is_refused_before_anything(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    run_dir = snapshot_one(project, key)
    out = tmp_path / "report.txt"
    assert_bad_input(run_cli("report", str(run_dir), "--out", str(out)), ".txt", "--format")
    assert not out.exists()


def test_a_directory_without_manifests_is_bad_input(project: Project, tmp_path: Path) -> None:
    empty = project.root / "empty"
    empty.mkdir()
    out = tmp_path / "r.html"
    assert_bad_input(run_cli("report", str(empty), "--out", str(out)), "no manifest")
    assert not out.exists()
    result = run_cli("report", str(empty), "--out", str(out), "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["exit_code"] == 2


def test_trust_options_apply_to_the_verification_shown(project: Project, tmp_path: Path) -> None:
    # A signer only the repository's own work-tree store vouches for: unanchored.
    signer = untrusted_key("contributor")
    project.trust_store().add(signer.private_key.public_key(), "contributor")
    run_dir = snapshot_one(project, signer)
    out = tmp_path / "r.json"

    result = run_cli("report", str(run_dir), "--out", str(out))
    assert result.exit_code == 1, result.output  # unanchored: a failed check by default
    assert json.loads(out.read_text())["verdict"] == "FAIL"

    result = run_cli("report", str(run_dir), "--out", str(out), "--allow-unanchored")
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert "unanchored signers allowed by --allow-unanchored" in document["trust"]
    assert "--allow-unanchored" in document["runs"][0]["reproduce"][0]
    (shown,) = document["runs"][0]["signers"]
    assert (shown["name"], shown["anchor"], shown["anchored"]) == (
        "contributor",
        "repository",
        False,
    )

    result = run_cli("report", str(run_dir), "--out", str(out), "--require-anchor")
    assert result.exit_code == 1, result.output
    document = json.loads(out.read_text())
    assert document["verdict"] == "FAIL"
    assert "anchors required" in document["trust"]
    (run,) = document["runs"]
    (failure,) = run["verification"]["failures"]
    assert failure["failures"][0]["check"] == "signature"
    assert "--require-anchor" in run["reproduce"][0]

    pem = tmp_path / "contributor.pem"
    pem.write_bytes(public_pem(signer.private_key.public_key()))
    result = run_cli("report", str(run_dir), "--out", str(out), "--trusted-key", str(pem))
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    (shown,) = document["runs"][0]["signers"]
    assert (shown["anchor"], shown["anchored"]) == ("--trusted-key", True)
    assert f"--trusted-key {pem}" in document["runs"][0]["reproduce"][0]


def test_a_replay_that_did_not_reproduce_fails_the_report(repo: Path, tmp_path: Path) -> None:
    record(repo, "programs", "noisy.py", "10")
    run_dir = repo / "programs" / "checkpoints" / "noisy"
    assert run_cli("replay", str(manifest(run_dir, 10)), "--attest").exit_code == 1
    out = tmp_path / "r.md"
    result = run_cli("report", str(run_dir), "--out", str(out))
    assert result.exit_code == 1, result.output
    md = out.read_text()
    assert md.startswith("# kaudit report: FAIL\n")
    assert "the replay of step 10 fails" in md
    assert "NOT\\_REPRODUCED" in md
    assert "/noise" in md
    assert run_cli("report", str(run_dir), "--out", str(tmp_path / "r.json")).exit_code == 1
    document = json.loads((tmp_path / "r.json").read_text())
    (replay,) = document["runs"][0]["replays"]
    assert replay["outcome"] == "NOT_REPRODUCED"
    assert replay["verified"] is False
    noise = next(d for d in replay["datasets"] if d["path"] == "/noise")
    assert noise["ok"] is False
    assert document["runs"][0]["verification"]["failed"] == 0  # the run itself verifies
    assert run_cli("report", str(run_dir), "--out", str(tmp_path / "r.html")).exit_code == 1
    html = (tmp_path / "r.html").read_text()
    assert 'class="verdict fail"' in html
    assert "NOT_REPRODUCED" in html
    assert 'class="bar-fail"' in html  # the dataset that differs, drawn as failing
