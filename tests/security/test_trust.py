"""Trust anchors, revocation and keys, attacked as someone holding no trusted key would.

The attacker (mallory) can write anything in the repository: add their key to
``.kaudit/trusted-keys/``, commit it on a branch, sign checkpoints. The owner (the
``key`` fixture, "tester") holds the real key; the verifier brings anchors.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from kronos_audit.keys.anchors import Anchor, TrustOptions, load_keyring
from kronos_audit.keys.home import user_trust_dir
from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.manifest import Manifest
from tests.helpers import KAUDIT, assert_bad_input, git, run_cli, write_checkpoint


def pub_file(directory: Path, key: SigningKey) -> Path:
    """The key's public half as a PEM file, as it is handed over out of band."""
    path = directory / f"{key.name}.pub"
    path.write_bytes(public_pem(key.private_key.public_key()))
    return path


def sign(project: Project, step: int, key: SigningKey, run: str = "run1") -> Manifest:
    ckpt = write_checkpoint(project.root / "checkpoints" / run / f"step-{step:08d}.h5", step)
    (m,) = snapshot(ckpt, run=run, step=step, key=key)
    return m


@pytest.fixture
def forged(project: Project, key: SigningKey, mallory: SigningKey) -> tuple[Manifest, Manifest]:
    """An honest manifest, and one mallory signed after adding their key to the
    repository's own trust store (what any pull request can do)."""
    honest = sign(project, 1, key)
    project.trust_store().add(mallory.private_key.public_key(), "mallory")
    return honest, sign(project, 2, mallory)


def test_a_key_only_the_repository_vouches_for_fails_unless_the_verifier_allows_it(
    forged: tuple[Manifest, Manifest], project: Project, kaudit_home: Path
) -> None:
    honest, evil = forged
    default = run_cli("verify", str(evil.path), cwd=project.root)
    assert default.exit_code == 1, default.output  # secure by default
    assert "signed by mallory" in default.stdout
    assert "only the repository's own .kaudit/trusted-keys vouches for" in default.stdout
    assert "--allow-unanchored" in default.stdout  # the line says how to accept it

    allowed = run_cli("verify", "--allow-unanchored", str(evil.path), cwd=project.root)
    assert allowed.exit_code == 0, allowed.output
    assert "unanchored: only the repository's .kaudit/trusted-keys" in allowed.stdout
    assert "passed unanchored, as --allow-unanchored says" in allowed.stdout

    # The user's own config may allow it too, and the output names that file...
    config = kaudit_home / "config.toml"
    config.write_text("[trust]\nallow_unanchored = true\n")
    by_config = run_cli("verify", str(evil.path), cwd=project.root)
    assert by_config.exit_code == 0, by_config.output
    assert f"passed unanchored, as {config} says" in by_config.stdout
    # ...but --require-anchor, or an anchor named for this verification, says otherwise.
    required = run_cli("verify", "--require-anchor", str(evil.path), cwd=project.root)
    assert required.exit_code == 1, required.output
    # The repository's own config can never allow it: only the user's is read.
    config.unlink()
    (project.root / ".kaudit" / "config.toml").write_text("[trust]\nallow_unanchored = true\n")
    repo_says = run_cli("verify", str(evil.path), cwd=project.root)
    assert repo_says.exit_code == 1, repo_says.output

    mine = run_cli("verify", str(honest.path), cwd=project.root)
    assert mine.exit_code == 0, mine.output
    assert "signed by tester" in mine.stdout
    assert "anchor: user trust store" in mine.stdout


def test_a_malformed_user_config_is_one_line_not_a_guess(
    forged: tuple[Manifest, Manifest], project: Project, kaudit_home: Path
) -> None:
    honest, _ = forged
    config = kaudit_home / "config.toml"
    for text in ("[trust]\nallow_unanchored = 'yes'\n", "[trust\n"):
        config.write_text(text)
        done = run_cli("verify", str(honest.path), cwd=project.root)
        assert done.exit_code == 2, done.output
        assert str(config) in done.output
        assert "Traceback" not in done.output


def test_a_key_given_on_the_command_line_is_the_anchor_and_implies_require_anchor(
    forged: tuple[Manifest, Manifest], project: Project, key: SigningKey, tmp_path: Path
) -> None:
    honest, evil = forged
    owner = pub_file(tmp_path, key)
    for p in user_trust_dir().iterdir():  # an auditor's machine: only what they were handed
        p.unlink()
    refused = run_cli("verify", "--trusted-key", str(owner), str(evil.path))
    assert refused.exit_code == 1, refused.output
    assert "unanchored" in refused.stdout
    accepted = run_cli("verify", "--trusted-key", str(owner), str(honest.path))
    assert accepted.exit_code == 0, accepted.output
    signer = f"signed by tester (key {key.key_id[:16]}), anchor: --trusted-key {owner}"
    assert signer in accepted.stdout
    # Both at once: one passes, one fails, exit 1.
    both = run_cli("verify", "--trusted-key", str(owner), str(honest.path), str(evil.path))
    assert both.exit_code == 1


def test_kaudit_trusted_keys_is_an_anchor(
    forged: tuple[Manifest, Manifest],
    key: SigningKey,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    honest, evil = forged
    for p in user_trust_dir().iterdir():
        p.unlink()
    anchors = tmp_path / "anchors"
    anchors.mkdir()
    pub_file(anchors, key)
    monkeypatch.setenv("KAUDIT_TRUSTED_KEYS", f"{tmp_path / 'missing-is-fine-not'}:{anchors}")
    bad = run_cli("verify", "--require-anchor", str(honest.path))
    assert_bad_input(bad, "missing-is-fine-not")  # a named anchor that is not there: bad input
    monkeypatch.setenv("KAUDIT_TRUSTED_KEYS", str(anchors))
    ok = run_cli("verify", "--require-anchor", str(honest.path))
    assert ok.exit_code == 0, ok.output
    assert "anchor: KAUDIT_TRUSTED_KEYS" in ok.stdout
    assert run_cli("verify", "--require-anchor", str(evil.path)).exit_code == 1


def test_trust_ref_reads_the_store_at_the_ref_not_the_work_tree(
    project: Project, key: SigningKey, mallory: SigningKey
) -> None:
    root = project.root
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "trust tester")
    for p in user_trust_dir().iterdir():  # CI: no user store, only the protected branch
        p.unlink()
    honest = sign(project, 1, key)
    git(root, "checkout", "-q", "-b", "pull-request")
    project.trust_store().add(mallory.private_key.public_key(), "mallory")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "trust me")
    evil = sign(project, 2, mallory)

    at_main = run_cli("verify", "--trust-ref", "main", str(honest.path), cwd=root)
    assert at_main.exit_code == 0, at_main.output
    main = git(root, "rev-parse", "main").strip()
    # the one full ref and the commit it named, in the ok line
    assert (
        f"anchor: --trust-ref refs/heads/main at {main}:.kaudit/trusted-keys/tester.pub"
        in at_main.stdout
    )
    refused = run_cli("verify", "--trust-ref", "main", str(evil.path), cwd=root)
    assert refused.exit_code == 1, refused.output
    assert "no trust anchor holds" in refused.stdout
    # The branch's own commit does trust mallory: the ref decides, not the work tree.
    at_branch = run_cli("verify", "--trust-ref", "pull-request", str(evil.path), cwd=root)
    assert at_branch.exit_code == 0, at_branch.output
    # Removing tester from the work tree changes nothing under --trust-ref main.
    (project.trust_dir / "tester.pub").unlink()
    assert run_cli("verify", "--trust-ref", "main", str(honest.path), cwd=root).exit_code == 0

    assert_bad_input(
        run_cli("verify", "--trust-ref", "no-such-branch", str(honest.path), cwd=root),
        "no-such-branch",
        "no such ref",
    )
    assert_bad_input(
        run_cli("verify", "--trust-ref", "--output=/tmp/x", str(honest.path), cwd=root),
        "not a git ref name",
    )


def test_a_pinned_trust_ref_is_read_at_its_commit_however_the_ref_moves(
    project: Project, key: SigningKey, mallory: SigningKey
) -> None:
    root = project.root
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "trust tester")
    git(root, "tag", "-a", "-m", "an annotated tag", "v1")
    pinned = TrustOptions(trust_ref="main").pin(root)
    assert pinned.pinned is not None
    assert pinned.pinned.ref == "refs/heads/main"
    # main moves on to a commit that trusts mallory
    project.trust_store().add(mallory.private_key.public_key(), "mallory")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "trust mallory")
    assert mallory.key_id not in load_keyring(root, pinned).keys
    assert mallory.key_id in load_keyring(root, TrustOptions(trust_ref="main")).keys
    # an annotated tag is peeled to its commit
    tag = load_keyring(root, TrustOptions(trust_ref="v1")).trust_ref
    assert tag is not None
    assert (tag.ref, tag.commit) == ("refs/tags/v1", pinned.pinned.commit)


def test_a_symlink_committed_in_the_store_is_skipped_at_the_ref(
    project: Project, key: SigningKey, mallory: SigningKey, tmp_path: Path
) -> None:
    root = project.root
    outside = pub_file(tmp_path, mallory)
    (project.trust_dir / "evil.pub").symlink_to(outside)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "a symlink in the store")
    ring = load_keyring(root, TrustOptions(trust_ref="main"))
    assert mallory.key_id not in ring.keys
    assert any("evil.pub" in p and "not a regular file" in p for p in ring.problems)
    assert ring.keys[key.key_id].anchor is Anchor.TRUST_REF  # tester, committed as a file


def test_bad_trust_store_entries_are_skipped_one_by_one_never_a_hang(
    forged: tuple[Manifest, Manifest],
    project: Project,
    mallory: SigningKey,
    tmp_path: Path,
) -> None:
    honest, _ = forged
    store = project.trust_dir
    (store / "mallory.pub").unlink()
    evil = project.root / "checkpoints" / "run1" / "step-00000002.h5.kaudit.json"
    # A symlink to a key outside the repository, a FIFO, an RSA key, garbage.
    (store / "linked.pub").symlink_to(pub_file(tmp_path, mallory))
    os.mkfifo(store / "blocking.pub")
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (store / "rsa.pub").write_bytes(
        rsa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    (store / "garbage.pub").write_text("not a key\n")
    env = dict(os.environ.items())
    done = subprocess.run(
        [*KAUDIT, "verify", str(honest.path), str(evil)],
        cwd=project.root,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # mallory's is refused...
    # ...tester's still verifies
    assert f"ok   {honest.path.relative_to(project.root)}" in done.stdout
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    for name, why in (
        ("linked.pub", "symbolic link"),
        ("blocking.pub", "FIFO"),
        ("rsa.pub", "not an Ed25519 public key"),
        ("garbage.pub", "not a PEM public key"),
    ):
        assert any(name in w and why in w and "skipped" in w for w in warnings), (name, warnings)
    assert "Traceback" not in done.stderr


# -- revocation and rotation ------------------------------------------------------------


def test_a_revoked_key_fails_from_its_revocation_on(project: Project, key: SigningKey) -> None:
    before = sign(project, 1, key)
    result = run_cli(
        "keys", "revoke", key.key_id[:12], "--reason", "laptop stolen", cwd=project.root
    )
    assert result.exit_code == 0, result.output
    revocation = project.root / ".kaudit" / "revocations" / f"{key.key_id}.json"
    assert revocation.is_file()
    after = sign(project, 2, key)  # the thief signs on

    old = run_cli("verify", str(before.path), cwd=project.root)
    assert old.exit_code == 0, old.output
    assert "revoked at" in old.stdout
    assert "signed before" in old.stdout
    new = run_cli("verify", str(after.path), cwd=project.root)
    assert new.exit_code == 1
    assert "revoked at" in new.stdout
    assert "laptop stolen" in new.stdout

    listed = run_cli("keys", "list", cwd=project.root)
    assert "revoked at" in listed.stdout

    # A revocation whose signature does not hold is reported and ignored.
    revocation.write_text(revocation.read_text().replace('"sig": "', '"sig": "AAAA'))
    again = run_cli("verify", str(after.path), cwd=project.root)
    assert again.exit_code == 0
    assert "revocation" in again.stderr
    assert "skipped" in again.stderr
    # Read as strictly as a manifest: JSON that means two things to two readers is refused.
    revocation.write_text(
        '{"payloadType": "a", "payloadType": "b", "payload": "", "signatures": []}'
    )
    dup = run_cli("verify", str(after.path), cwd=project.root)
    assert dup.exit_code == 0
    assert "duplicate key 'payloadType'" in dup.stderr


def test_a_revocation_signed_by_a_key_nobody_trusts_is_ignored(
    project: Project, key: SigningKey, mallory: SigningKey
) -> None:
    from kronos_audit.keys.revocation import write_revocation

    m = sign(project, 1, key)
    write_revocation(project.root, key.key_id, "i say so", mallory, at="2000-01-01T00:00:00Z")
    result = run_cli("verify", str(m.path), cwd=project.root)
    assert result.exit_code == 0, result.output
    assert "not signed by a key this verification trusts" in result.stderr


def test_rotation_makes_a_new_key_and_revokes_the_old(project: Project, key: SigningKey) -> None:
    result = run_cli("keys", "rotate", "tester", "--name", "tester-2027", cwd=project.root)
    assert result.exit_code == 0, result.output
    new = sign(project, 1, key=_held("tester-2027"))
    old = sign(project, 2, key)
    assert run_cli("verify", str(new.path), cwd=project.root).exit_code == 0
    refused = run_cli("verify", str(old.path), cwd=project.root)
    assert refused.exit_code == 1
    assert "rotated to tester-2027" in refused.stdout


def test_a_key_rotated_away_cannot_revoke_its_successor(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    rotated = run_cli("keys", "rotate", "tester", "--name", "tester-2027", cwd=project.root)
    assert rotated.exit_code == 0, rotated.output
    successor = _held("tester-2027")
    # Whoever still holds the old key signs a revocation of the new one (after the
    # rotation: it says so itself, the time is now).
    revoked = run_cli(
        "keys",
        "revoke",
        successor.key_id,
        "--reason",
        "mine now",
        "--key",
        "tester",
        cwd=project.root,
    )
    assert revoked.exit_code == 0, revoked.output
    m = sign(project, 1, successor)
    anchored = pub_file(tmp_path, successor)
    result = run_cli("verify", "--trusted-key", str(anchored), str(m.path), cwd=project.root)
    assert result.exit_code == 0, result.output
    assert "signed by tester-2027" in result.stdout
    assert "revoked at" not in result.stdout
    (warning,) = [
        line
        for line in result.stderr.splitlines()
        if f"revocation of {successor.key_id[:16]} ignored" in line
    ]
    assert "tester" in warning
    assert "a revoked key revokes nothing" in warning
    ring = load_keyring(project.root, TrustOptions(trusted_keys=(anchored,)))
    assert successor.key_id not in ring.revocations
    assert ring.revocations[key.key_id].reason.startswith("rotated to tester-2027")
    listed = run_cli("keys", "list", cwd=project.root)
    lines = [line for line in listed.stdout.splitlines() if successor.key_id in line]
    assert lines
    assert not any("revoked" in line for line in lines)


def test_what_a_key_revoked_before_its_rotation_stays_revoked(
    project: Project, key: SigningKey, mallory: SigningKey
) -> None:
    from kronos_audit.keys.revocation import write_revocation

    project.trust_store().add(mallory.private_key.public_key(), "mallory")
    allowed = TrustOptions(allow_unanchored=True)  # mallory's key counts here
    # tester revokes mallory in 2030, then is rotated away in 2031: the first stands.
    write_revocation(project.root, mallory.key_id, "left", key, at="2030-01-01T00:00:00Z")
    write_revocation(project.root, key.key_id, "rotated", key, at="2031-01-01T00:00:00Z")
    ring = load_keyring(project.root, allowed)
    assert ring.revocations[mallory.key_id].revoked_at == "2030-01-01T00:00:00Z"
    assert ring.revocations[key.key_id].revoked_at == "2031-01-01T00:00:00Z"
    assert not ring.problems
    # mallory, revoked in 2030, revoking tester back in 2032 changes nothing (the file
    # takes the place of tester's own revocation: tester is then not revoked at all).
    write_revocation(project.root, key.key_id, "revenge", mallory, at="2032-01-01T00:00:00Z")
    ring = load_keyring(project.root, allowed)
    assert key.key_id not in ring.revocations
    (problem,) = ring.problems
    assert "revocation of " + key.key_id[:16] + " ignored" in problem
    assert "revoked at 2030-01-01T00:00:00Z (left)" in problem
    # The limit: without trusted timestamps the order is the one the records claim, so
    # the same revocation dated before mallory's own counts.
    write_revocation(project.root, key.key_id, "revenge", mallory, at="2029-01-01T00:00:00Z")
    assert load_keyring(project.root, allowed).revocations[key.key_id].signer == mallory.key_id


def _held(name: str) -> SigningKey:
    from kronos_audit.keys.home import select_key

    return select_key(name)


def test_revoking_needs_a_trusted_signer_and_a_key_id(project: Project, key: SigningKey) -> None:
    assert_bad_input(
        run_cli("keys", "revoke", "zz", "--reason", "x", cwd=project.root), "not a key id"
    )
    assert_bad_input(
        run_cli("keys", "revoke", "0123456789", "--reason", "x", cwd=project.root),
        "no trusted key",
    )


# -- private keys -----------------------------------------------------------------------


def test_an_encrypted_key_signs_with_its_passphrase(
    project: Project, checkpoint: Path, monkeypatch: pytest.MonkeyPatch, kaudit_home: Path
) -> None:
    monkeypatch.setenv("KAUDIT_KEY_PASSPHRASE", "correct horse")
    made = run_cli("keys", "generate", "--name", "enc", "--encrypt", cwd=project.root)
    assert made.exit_code == 0, made.output
    private = kaudit_home / "keys" / "enc.key"
    assert b"ENCRYPTED PRIVATE KEY" in private.read_bytes()
    signed = run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1", "--key", "enc")
    assert signed.exit_code == 0, signed.output

    monkeypatch.delenv("KAUDIT_KEY_PASSPHRASE")
    other = write_checkpoint(project.root / "checkpoints" / "run1" / "step-00000002.h5", 2)
    args = ("snapshot", str(other), "--run", "run1", "--step", "2", "--key", "enc")
    assert_bad_input(run_cli(*args), "encrypted", "KAUDIT_KEY_PASSPHRASE")
    monkeypatch.setenv("KAUDIT_KEY_PASSPHRASE", "wrong")
    assert_bad_input(run_cli(*args), "wrong passphrase")
    assert not other.with_name(other.name + ".kaudit.json").exists()


def test_a_private_key_others_can_read_is_refused(
    project: Project, key: SigningKey, checkpoint: Path, kaudit_home: Path
) -> None:
    private = kaudit_home / "keys" / "tester.key"
    private.chmod(0o644)
    result = run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1")
    assert_bad_input(result, "permissions 0644 are too open", "chmod 600")
    assert not checkpoint.with_name(checkpoint.name + ".kaudit.json").exists()
    private.chmod(0o600)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1").exit_code == 0


def test_kaudit_home_inside_a_repository_is_refused(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = sign(project, 1, key)
    inside = project.root / "keys-here"
    monkeypatch.setenv("KAUDIT_HOME", str(inside))
    assert_bad_input(run_cli("keys", "generate", cwd=project.root), "inside the git repository")
    assert not inside.exists()
    assert_bad_input(run_cli("verify", str(m.path)), "KAUDIT_HOME", "outside any repository")


@pytest.fixture
def no_user_anchor() -> None:
    for p in user_trust_dir().iterdir():
        p.unlink()
    return


def test_the_keyring_prefers_the_strongest_anchor(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    owner = pub_file(tmp_path, key)
    ring = load_keyring(project.root, TrustOptions(trusted_keys=(owner,)))
    assert ring.keys[key.key_id].anchor is Anchor.COMMAND_LINE
    assert ring.require_anchor
    assert load_keyring(project.root).keys[key.key_id].anchor is Anchor.USER


def test_without_the_user_store_the_repository_key_is_unanchored(
    project: Project, key: SigningKey, no_user_anchor: None
) -> None:
    ring = load_keyring(project.root)
    assert ring.keys[key.key_id].anchor is Anchor.REPOSITORY
    assert ring.require_anchor  # by default such a signer fails
    allowed = load_keyring(project.root, TrustOptions(allow_unanchored=True))
    assert not allowed.require_anchor
    assert allowed.unanchored_allowed_by == "--allow-unanchored"


def test_a_key_is_named_the_same_whichever_anchor_vouches_for_it(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    # The owner's key is "tester" in the user's own store; handed over as owner.pub.
    (m,) = snapshot(
        write_checkpoint(project.root / "checkpoints" / "r" / "step-00000001.h5"),
        run="r",
        step=1,
        key=key,
    )
    owner = tmp_path / "owner.pub"
    owner.write_bytes(public_pem(key.private_key.public_key()))
    plain = run_cli("verify", str(m.path))
    named = run_cli("verify", "--trusted-key", str(owner), str(m.path))
    assert plain.exit_code == 0, plain.output
    assert named.exit_code == 0, named.output
    who = f"signed by tester (key {key.key_id[:16]})"
    assert who in plain.stdout
    assert f"{who}, anchor: --trusted-key {owner}" in named.stdout
    # The work tree's store (content) never renames a key something else vouches for.
    for p in (project.root / ".kaudit" / "trusted-keys").iterdir():
        p.unlink()
    project.trust_store().add(key.private_key.public_key(), "someone-else")
    again = run_cli("verify", "--trusted-key", str(owner), str(m.path))
    assert who in again.stdout, again.output
