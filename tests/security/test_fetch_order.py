"""Nothing is fetched before the signature holds, attacked through the
CLI: a real run pushed to a real DVC remote (a local directory), committed, and verified
or pulled in a fresh `git clone` holding no data and no DVC cache, in which an adversary
has edited `.dvc` files, added their own key and manifest, altered a manifest, or altered
the remote's objects. Also: a hostile `parent_manifest` locator never hangs, and finding
parents in a moved run directory is linear in the chain's length.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import kronos_audit as ka
from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.fsutil import TEMP_PREFIX
from kronos_audit.checkpoint.hashing import digest_file
from kronos_audit.keys.home import generate_key
from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.provenance.gitstate import git_state
from kronos_audit.signing.sign import sign_checkpoint
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.statement.manifest import Manifest
from kronos_audit.storage import cache_object_path, cache_settings, configure_remote, dvc_file_for
from tests.helpers import KAUDIT, elsewhere, git, run_cli, untrusted_key, write_checkpoint

STEPS = (10, 20, 30)
# The module that reads a chain's manifests (its parents and their siblings).
verify_module = importlib.import_module("kronos_audit.verification.chain")


@dataclass(frozen=True)
class Origin:
    """The owner's repository: a run pushed to the remote and committed."""

    project: Project
    """The repository that ran and pushed."""
    remote: Path
    """The DVC remote (a local directory) the clones fetch from."""
    data: dict[int, bytes]
    """Each step's checkpoint bytes, as the owner wrote and signed them."""
    owner_pub: Path
    """The owner's public key, as an auditor obtains it out of band."""


def ckpt(root: Path, step: int) -> Path:
    return root / "checkpoints" / "heat" / f"step-{step:08d}.h5"


def manifest_of(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name + ".kaudit.json")


def remote_object(remote: Path, md5: str) -> Path:
    return remote / "files" / "md5" / md5[:2] / md5[2:]


def leftovers(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob(TEMP_PREFIX + "*") if ".git" not in p.parts)


@pytest.fixture
def origin(project: Project, key: SigningKey, tmp_path: Path) -> Origin:
    remote = tmp_path / "remote"
    configure_remote(project, str(remote))
    with ka.Run("heat", root=project.root / "checkpoints", seed=5, every=ka.EverySteps(10)) as run:
        state = run.restore() or {"u": run.rng.random((32, 32))}
        for step in run.steps(max(STEPS)):
            state = {"u": 0.5 * state["u"] + 0.5 * run.rng.random((32, 32))}
            run.checkpoint(step, state)
    run_dir = project.root / "checkpoints" / "heat"
    pushed = run_cli("push", str(run_dir))
    assert pushed.exit_code == 0, pushed.output
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "run")
    owner_pub = tmp_path / "owner.pub"
    owner_pub.write_bytes(public_pem(key.private_key.public_key()))
    return Origin(
        project, remote, {s: ckpt(project.root, s).read_bytes() for s in STEPS}, owner_pub
    )


def clone(origin: Origin, to: Path) -> Project:
    git(to.parent, "clone", "-q", str(origin.project.root), str(to))
    for step in STEPS:
        assert not ckpt(to, step).exists()
    return Project(to)


def trust_store_files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / ".kaudit" / "trusted-keys").iterdir())


# -- .dvc files are not consulted --------------------------------------------------------


def hostile_dvc_file(here: Project, origin: Origin, evil: bytes) -> None:
    """What an adversary commits: step 10's .dvc file naming another object (their public
    key, which they put in the remote) at a path in the trust store."""
    md5 = hashlib.md5(evil).hexdigest()
    obj = remote_object(origin.remote, md5)
    obj.parent.mkdir(parents=True, exist_ok=True)
    obj.write_bytes(evil)
    dvc_file_for(ckpt(here.root, 10)).write_text(
        f"outs:\n- md5: {md5}\n  size: {len(evil)}\n  hash: md5\n"
        "  path: ../../.kaudit/trusted-keys/evil.pub\n"
    )


@pytest.mark.slow
@pytest.mark.parametrize("command", ["verify", "pull"])
def test_a_dvc_file_pointing_into_the_trust_store_is_not_followed(
    origin: Origin, tmp_path: Path, command: str
) -> None:
    here = clone(origin, tmp_path / "clone")
    evil = untrusted_key("evil")
    hostile_dvc_file(here, origin, public_pem(evil.private_key.public_key()))
    store_before = trust_store_files(here.root)

    result = run_cli(command, str(here.root / "checkpoints" / "heat"))
    assert result.exit_code == 0, result.output
    assert not (here.root / ".kaudit" / "trusted-keys" / "evil.pub").exists()
    assert trust_store_files(here.root) == store_before
    for step in STEPS:  # each signed object, to its checkpoint's own path
        assert ckpt(here.root, step).read_bytes() == origin.data[step]
    assert leftovers(here.root) == []
    if command == "verify":
        assert "fetched from the DVC remote" in result.stdout
    else:
        assert result.stdout.count("(fetched)") == len(STEPS)


# -- a manifest that does not verify is not fetched for ----------------------------------


def attacker_checkpoint(here: Project, origin: Origin, home: Path) -> Path:
    """An adversary with their own key (in their own KAUDIT_HOME) adds it to the clone's
    trust store, signs a step-40 checkpoint chained to the owner's step 30, puts its
    object in the remote and leaves only the manifest and .dvc file in the repository."""
    with elsewhere(home):
        evil = generate_key("evil")
        target = write_checkpoint(ckpt(here.root, 40), seed=40)
        (signed,) = snapshot(
            target, run="heat", step=40, parent=manifest_of(ckpt(here.root, 30)), key=evil
        )
    here.trust_store().add(evil.private_key.public_key(), "evil")
    md5 = signed.subject_md5
    assert md5 is not None
    obj = remote_object(origin.remote, md5)
    obj.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(target, obj)
    target.unlink()
    cache_object_path(cache_settings(here)[0], md5).unlink()
    return target


@pytest.mark.slow
def test_a_manifest_signed_by_an_unanchored_key_is_not_fetched_for_under_an_anchor(
    origin: Origin, tmp_path: Path
) -> None:
    here = clone(origin, tmp_path / "clone")
    planted = attacker_checkpoint(here, origin, tmp_path / "attacker-home")
    run_dir = here.root / "checkpoints" / "heat"

    anchored = run_cli("verify", "--trusted-key", str(origin.owner_pub), str(run_dir))
    assert anchored.exit_code == 1, anchored.output
    assert f"FAIL {manifest_of(planted)}" in anchored.stdout
    assert "signature: signed by evil" in anchored.stdout
    assert not os.path.lexists(planted)  # nothing the unverified manifest names was fetched
    for step in STEPS:
        assert ckpt(here.root, step).read_bytes() == origin.data[step]

    required = run_cli("verify", "--require-anchor", str(run_dir))
    assert required.exit_code == 1, required.output
    assert "unanchored" in required.stdout
    assert not os.path.lexists(planted)

    pulled = run_cli("pull", "--trusted-key", str(origin.owner_pub), str(run_dir))
    assert pulled.exit_code == 1, pulled.output
    assert not os.path.lexists(planted)

    # By default the work tree's store alone is no anchor, and nothing is fetched for it.
    default = run_cli("verify", str(run_dir))
    assert default.exit_code == 1, default.output
    assert "unanchored" in default.stdout
    assert not os.path.lexists(planted)

    # Only when the verifier allows it is that store taken at its word, and output says so.
    everyday = run_cli("verify", "--allow-unanchored", str(run_dir))
    assert everyday.exit_code == 0, everyday.output
    (line,) = [ln for ln in everyday.stdout.splitlines() if str(manifest_of(planted)) in ln]
    assert line.startswith("ok ")
    assert "signed by evil" in line
    assert "unanchored" in line
    assert "1 signed by unanchored keys" in everyday.stdout.strip().splitlines()[-1]
    assert planted.exists()  # fetched, once its (unanchored) signature held
    assert leftovers(here.root) == []


def rewrite_payload(manifest: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change the statement and re-encode it, keeping the old signature."""
    envelope = json.loads(manifest.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    change(statement)
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    manifest.write_text(json.dumps(envelope, indent=2))


@pytest.mark.slow
@pytest.mark.parametrize("command", ["verify", "pull"])
def test_a_manifest_whose_signature_fails_is_not_fetched_for(
    origin: Origin, tmp_path: Path, command: str
) -> None:
    here = clone(origin, tmp_path / "clone")
    target = ckpt(here.root, 20)
    # The adversary points step 20's manifest at step 10's object, digests and size all
    # consistent (bytes the remote holds): only the broken signature stops the fetch.
    step_10 = ka.read_manifest(manifest_of(ckpt(here.root, 10)))

    def edit(statement: dict[str, Any]) -> None:
        statement["subject"][0]["digest"] = dict(step_10.statement["subject"][0]["digest"])
        statement["predicate"]["size"] = step_10.predicate["size"]

    rewrite_payload(manifest_of(target), edit)
    result = run_cli(command, str(here.root / "checkpoints" / "heat"))
    assert result.exit_code == 1, result.output
    assert "signature" in result.stdout
    assert not os.path.lexists(target)
    assert ckpt(here.root, 10).read_bytes() == origin.data[10]
    assert ckpt(here.root, 30).read_bytes() == origin.data[30]
    assert leftovers(here.root) == []


@pytest.mark.slow
@pytest.mark.parametrize("command", ["verify", "pull"])
def test_a_tampered_remote_object_never_becomes_visible(
    origin: Origin, tmp_path: Path, command: str
) -> None:
    here = clone(origin, tmp_path / "clone")
    target = ckpt(here.root, 20)
    md5 = ka.read_manifest(manifest_of(target)).subject_md5
    assert md5 is not None
    obj = remote_object(origin.remote, md5)
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0x01
    os.chmod(obj, 0o644)
    obj.write_bytes(bytes(data))

    result = run_cli(command, str(here.root / "checkpoints" / "heat"))
    assert result.exit_code == 1, result.output
    assert f"{target}" in result.stdout
    assert "file digest" in result.stdout
    assert not os.path.lexists(target)
    assert not cache_object_path(cache_settings(here)[0], md5).exists()
    assert leftovers(here.root) == []
    assert ckpt(here.root, 30).read_bytes() == origin.data[30]


# -- hostile parent locators, linear parent search -----------------------------------------


def chain(project: Project, key: SigningKey, n: int, *, size: int = 64) -> list[Manifest]:
    """``n`` signed, chained checkpoints of run ``run1`` (sign_checkpoint: hashed once,
    the git state read once)."""
    state = git_state(project.root)
    manifests: list[Manifest] = []
    for step in range(1, n + 1):
        path = project.root / "checkpoints" / "run1" / f"step-{step:08d}.h5"
        write_checkpoint(path, seed=step, n=size)
        manifests.append(
            sign_checkpoint(
                path,
                digest_file(path, md5=True),
                project=project,
                key=key,
                run="run1",
                step=step,
                parent=manifests[-1] if manifests else None,
                git=state,
            )
        )
    return manifests


def resign(manifest: Path, key: SigningKey, change: Callable[[dict[str, Any]], None]) -> None:
    """Change the predicate and sign the statement again with ``key`` (a trusted key)."""
    statement = json.loads(ka.read_manifest(manifest).envelope.payload)
    change(statement["predicate"])
    manifest.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), key)))


def kaudit(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed kaudit in a subprocess: a hang is a timeout, not a stuck test run."""
    return subprocess.run([*KAUDIT, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("locator", ["../../../../dev/zero", "/dev/zero", "fifo", "run1-fifo"])
def test_a_hostile_parent_locator_fails_the_link_and_never_hangs(
    project: Project, key: SigningKey, locator: str
) -> None:
    first, second = chain(project, key, 2, size=8)
    run_dir = second.path.parent
    if locator == "fifo":
        os.mkfifo(project.root / "fifo")  # a FIFO inside the repository
    elif locator == "run1-fifo":
        # A FIFO beside the manifests, named as one: the sibling search must not block.
        os.mkfifo(run_dir / "step-00000000.h5.kaudit.json")
        locator = "checkpoints/run1/step-00000000.h5.kaudit.json"
    resign(second.path, key, lambda p: p.update(parent_manifest=locator))

    # The true parent beside it: the digest is the link, found among the siblings.
    done = kaudit("verify", "--json", str(second.path))
    assert done.returncode == 0, done.stdout + done.stderr
    (result,) = json.loads(done.stdout)["results"]
    assert result["ok"]

    # Gone: one failing parent-link check, promptly.
    first.path.unlink()
    done = kaudit("verify", "--json", str(second.path))
    assert done.returncode == 1, done.stdout + done.stderr
    (result,) = json.loads(done.stdout)["results"]
    assert [c["check"] for c in result["checks"] if not c["ok"]] == ["parent link"]
    assert "Traceback" not in done.stderr


def test_finding_parents_in_a_moved_run_directory_is_linear(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 200
    manifests = chain(project, key, n, size=8)
    moved = project.root / "archive" / "run1"
    moved.parent.mkdir(parents=True)
    shutil.move(project.root / "checkpoints" / "run1", moved)
    assert not (project.root / str(manifests[-1].predicate["parent_manifest"])).exists()

    reads: list[Path] = []
    real = verify_module.read_regular

    def counting(path: Path | str, limit: int, **kw: Any) -> bytes:
        reads.append(Path(path))
        data: bytes = real(path, limit, **kw)
        return data

    monkeypatch.setattr(verify_module, "read_regular", counting)
    results = ka.verify(moved)
    assert len(results) == n
    assert all(r.ok for r in results), [r.failures for r in results if not r.ok][:3]
    deepest = next(c for c in results[-1].checks if c.name == "parent link")
    assert deepest.detail == f"chain of {n} manifests back to step 1 verifies"
    # Each sibling read once for the index, each stale locator tried once: about 2N.
    # Scanning the siblings for every link would be N * N = 40,000.
    assert len(reads) <= 3 * n, len(reads)
