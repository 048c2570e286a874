"""`kaudit gate --trust-ref` resolves the ref to exactly one fully qualified ref.

A CI clone's ``origin/main`` is the remote-tracking branch ``refs/remotes/origin/main``;
git's own rules would prefer a tag or a branch of the same short name, which anyone who can
push a tag or a branch could create, pointing at a commit whose trust store holds their
key. The gate must refuse such a name rather than rank the candidates, and read everything
at the commit of the full ref it was given.
"""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from kronos_audit.keys.home import user_trust_dir
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.manifest import Manifest
from tests.gate.helpers import gate_json, set_gate
from tests.helpers import assert_bad_input, git, run_cli, write_checkpoint


def _sign(project: Project, run: str, key: SigningKey) -> Manifest:
    ckpt = write_checkpoint(project.root / "checkpoints" / run / "step-00000001.h5", 1)
    (m,) = snapshot(ckpt, run=run, step=1, key=key)
    return m


@pytest.fixture
def attacked(
    project: Project, key: SigningKey, mallory: SigningKey, tmp_path: Path
) -> tuple[Path, str, str]:
    """A clone whose origin/main is genuine (tester's store, a gate without replays),
    then a change by mallory: their key in the store, a run they signed, that commit
    pushed as a tag named ``origin/main``. Returns the repository, the genuine commit and
    the attacker's."""
    root = project.root
    set_gate(root, "segments = 0")
    _sign(project, "honest", key)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "trust tester")
    upstream = tmp_path / "upstream.git"
    git(tmp_path, "init", "-q", "--bare", str(upstream))
    git(root, "remote", "add", "origin", str(upstream))
    git(root, "push", "-q", "origin", "main")
    git(root, "fetch", "-q", "origin")
    genuine = git(root, "rev-parse", "refs/remotes/origin/main").strip()
    for p in user_trust_dir().iterdir():  # CI: no user store, only the protected branch
        p.unlink()
    git(root, "checkout", "-q", "-b", "change")
    project.trust_store().add(mallory.private_key.public_key(), "mallory")
    _sign(project, "forged", mallory)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "trust me")
    evil = git(root, "rev-parse", "HEAD").strip()
    git(root, "tag", "origin/main", evil)
    return root, genuine, evil


def test_a_tag_named_like_the_remote_branch_is_refused_as_ambiguous(
    attacked: tuple[Path, str, str],
) -> None:
    root, _, _ = attacked
    line = assert_bad_input(
        run_cli("gate", "--trust-ref", "origin/main", cwd=root),
        "ambiguous",
        "refs/tags/origin/main",
        "refs/remotes/origin/main",
    )
    assert "refs/..." in line  # says how to fix it
    # kaudit verify resolves the same way
    forged = root / "checkpoints" / "forged" / "step-00000001.h5.kaudit.json"
    assert_bad_input(
        run_cli("verify", "--trust-ref", "origin/main", str(forged), cwd=root),
        "refs/tags/origin/main",
        "refs/remotes/origin/main",
    )


def test_a_branch_named_like_the_remote_branch_is_refused_as_ambiguous(
    attacked: tuple[Path, str, str],
) -> None:
    root, _, evil = attacked
    git(root, "tag", "-d", "origin/main")
    git(root, "branch", "origin/main", evil)
    assert_bad_input(
        run_cli("gate", "--trust-ref", "origin/main", cwd=root),
        "ambiguous",
        "refs/heads/origin/main",
        "refs/remotes/origin/main",
    )


def test_the_full_remote_ref_verifies_against_the_genuine_store(
    attacked: tuple[Path, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, genuine, _ = attacked
    full = "refs/remotes/origin/main"
    junit = tmp_path / "gate.xml"
    doc = gate_json(root, "--trust-ref", full, "--junit", str(junit), exit_code=1)
    assert doc["trust_ref_resolved"] == {"given": full, "ref": full, "commit": genuine}
    assert doc["config"]["source"] == f"{full} at {genuine}:.kaudit/config.toml"
    (failure,) = doc["failures"]
    assert failure["name"] == "checkpoints/forged/step-00000001.h5.kaudit.json"
    assert "no trust anchor holds" in failure["message"]
    (passed,) = [c for c in doc["cases"] if c["ok"]]
    assert passed["name"] == "checkpoints/honest/step-00000001.h5.kaudit.json"
    assert f"anchor: --trust-ref {full} at {genuine}:" in passed["message"]
    properties = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert properties == {"trust_ref": full, "trust_ref_full": full, "trust_commit": genuine}
    # the human output names the ref and the commit too
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    text = run_cli("gate", "--trust-ref", full, cwd=root)
    assert text.exit_code == 1, text.output
    assert f"trust ref: {full} resolved to {full} at {genuine}" in text.stdout
    assert f"resolved to `{full} at {genuine}`" in summary.read_text()


def test_the_full_commit_id_is_a_trust_ref_an_abbreviated_one_is_not(
    attacked: tuple[Path, str, str],
) -> None:
    root, genuine, _ = attacked
    doc = gate_json(root, "--trust-ref", genuine, exit_code=1)
    assert doc["trust_ref_resolved"]["ref"] == genuine
    assert [f["name"] for f in doc["failures"]] == [
        "checkpoints/forged/step-00000001.h5.kaudit.json"
    ]
    assert_bad_input(run_cli("gate", "--trust-ref", genuine[:12], cwd=root), "in full")


def test_a_full_ref_must_exist_as_it_is(attacked: tuple[Path, str, str]) -> None:
    root, _, _ = attacked
    # refs/remotes/origin is a prefix of a ref, not a ref
    assert_bad_input(run_cli("gate", "--trust-ref", "refs/remotes/origin", cwd=root), "no such ref")
    assert_bad_input(run_cli("gate", "--trust-ref", "refs/remotes/*/main", cwd=root), "no such ref")


def test_head_resolves_to_the_commit_checked_out_and_prints_its_id(
    attacked: tuple[Path, str, str],
) -> None:
    root, _, evil = attacked
    doc = gate_json(
        root, "--trust-ref", "HEAD", exit_code=0
    )  # HEAD trusts mallory: the user's word
    assert doc["trust_ref_resolved"] == {"given": "HEAD", "ref": evil, "commit": evil}
    forged = root / "checkpoints" / "forged" / "step-00000001.h5.kaudit.json"
    done = run_cli("verify", "--trust-ref", "HEAD", str(forged), cwd=root)
    assert done.exit_code == 0, done.output
    assert f"anchor: --trust-ref commit {evil}:.kaudit/trusted-keys/mallory.pub" in done.stdout
    assert "HEAD" not in done.stdout  # the commit read, never the name that moves


def test_the_upstream_resolves_through_gits_configuration_even_beside_a_lookalike_tag(
    attacked: tuple[Path, str, str],
) -> None:
    root, genuine, _ = attacked
    git(root, "branch", "-q", "--set-upstream-to=refs/remotes/origin/main", "change")
    full = "refs/remotes/origin/main"
    for given in ("@{u}", "change@{upstream}"):
        doc = gate_json(root, "--trust-ref", given, exit_code=1)
        assert doc["trust_ref_resolved"] == {"given": given, "ref": full, "commit": genuine}
        assert [f["name"] for f in doc["failures"]] == [
            "checkpoints/forged/step-00000001.h5.kaudit.json"
        ]
    git(root, "checkout", "-q", "--detach")
    assert_bad_input(run_cli("gate", "--trust-ref", "@{u}", cwd=root), "--trust-ref @{u}")
    git(root, "checkout", "-q", "main")
    assert_bad_input(run_cli("gate", "--trust-ref", "@{u}", cwd=root), "no upstream")
