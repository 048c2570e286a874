"""The repository is the one the user stands in, found before any content is read.

The attacker can write anything in the run directory and the checkout (an unpacked CI
artifact, a tarball, an rsync) but holds no trusted key. A git repository of their own
dropped there, with their key in its trust store, their run signed and their commit at
``refs/remotes/origin/main``, must not answer for the content: ``kaudit verify`` and
``kaudit gate`` at the genuine trust ref, and ``ka.Run`` resuming its run, refuse it in
one line instead of following it. A genuine submodule is verified against its own
repository when the user stands in it, and said so when they do not. Real git, real
keys, the real CLI and real programs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kronos_audit.keys.home import user_trust_dir
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from tests.helpers import assert_bad_input, git, run_cli, write_checkpoint

TRUST_REF = "refs/remotes/origin/main"


def _publish(root: Path, upstream: Path) -> str:
    """Push ``root``'s main to a bare ``upstream`` and fetch it back: origin/main, as a
    CI clone has it. Returns its commit."""
    git(upstream.parent, "init", "-q", "--bare", str(upstream))
    git(root, "remote", "add", "origin", str(upstream))
    git(root, "push", "-q", "origin", "main")
    git(root, "fetch", "-q", "origin")
    return git(root, "rev-parse", TRUST_REF).strip()


def _project_copy(template: Path, where: Path) -> Project:
    shutil.copytree(template, where, symlinks=True)
    return Project(where.resolve())


def _forged_repository(
    where: Path, template: Path, mallory: SigningKey, command: list[str] | None = None
) -> tuple[Path, str]:
    """Mallory's own kaudit repository, made on their side: their key in its store, run
    ``evil`` signed and committed, that commit at its own origin/main. Returns the
    manifest (relative to the repository) and the commit."""
    evil = _project_copy(template, where)
    evil.trust_store().add(mallory.private_key.public_key(), "mallory")
    ckpt = write_checkpoint(where / "checkpoints" / "evil" / "step-00000001.h5", 1)
    (m,) = snapshot(ckpt, run="evil", step=1, key=mallory, command=command, cwd=where)
    git(where, "add", "-A")
    git(where, "commit", "-q", "-m", "trust me")
    commit = git(where, "rev-parse", "HEAD").strip()
    git(where, "update-ref", TRUST_REF, commit)
    return m.path.relative_to(where), commit


@pytest.fixture
def genuine(
    project: Project, key: SigningKey, repo_templates: tuple[Path, Path], tmp_path: Path
) -> Project:
    """The owner's checkout in CI: tester's key in the store at origin/main, and no user
    trust store (only the protected ref vouches)."""
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "trust tester")
    _publish(project.root, tmp_path / "upstream.git")
    for p in user_trust_dir().iterdir():
        p.unlink()
    return project


@pytest.mark.parametrize("claim", ["directory", "gitfile", "symlink"])
def test_verify_refuses_a_repository_dropped_in_the_checkout(
    genuine: Project,
    mallory: SigningKey,
    repo_templates: tuple[Path, Path],
    tmp_path: Path,
    claim: str,
) -> None:
    root = genuine.root
    made = tmp_path / "mallory-repo"
    manifest, commit = _forged_repository(made, repo_templates[1], mallory)
    dropped = root / "checkpoints" / "heat"
    if claim == "directory":  # the whole repository unpacked there
        shutil.move(made, dropped)
    else:  # the work tree there, its git directory elsewhere (a worktree's .git file or a link)
        shutil.copytree(made, dropped, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        if claim == "gitfile":
            (dropped / ".git").write_text(f"gitdir: {made / '.git'}\n")
        else:
            (dropped / ".git").symlink_to(made / ".git")
    assert git(dropped, "rev-parse", "HEAD").strip() == commit  # git itself takes it
    named = dropped / manifest
    for cwd, target in (
        (root, str(named.relative_to(root))),
        (root, "checkpoints"),
        (root / "checkpoints", "heat"),
        (tmp_path, str(named)),  # standing outside: the one found is inside another
    ):
        # the file named from where one stands
        line = assert_bad_input(
            run_cli("verify", "--trust-ref", TRUST_REF, target, cwd=cwd),
            f": error: {os.path.relpath(dropped, cwd)}",
        )
        assert "ok" not in run_cli("verify", "--trust-ref", TRUST_REF, target, cwd=cwd).stdout
        assert commit not in line
    # Standing in the whole checkout, naming nothing: every run in it, the same refusal.
    assert_bad_input(
        run_cli("verify", "--trust-ref", TRUST_REF, cwd=root),
        f" {dropped.relative_to(root)}/.git: ",
    )


def test_a_kaudit_directory_in_a_run_directory_is_refused(
    genuine: Project, key: SigningKey
) -> None:
    root = genuine.root
    ckpt = write_checkpoint(root / "checkpoints" / "heat" / "step-00000001.h5", 1)
    snapshot(ckpt, run="heat", step=1, key=key)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "a run")
    ok = run_cli("verify", "--trust-ref", TRUST_REF, "checkpoints/heat", cwd=root)
    assert ok.exit_code == 0, ok.output
    claim = root / "checkpoints" / "heat" / ".kaudit"
    shutil.copytree(root / ".kaudit", claim)
    assert_bad_input(
        run_cli("verify", "--trust-ref", TRUST_REF, "checkpoints/heat", cwd=root),
        f" {claim.relative_to(root)}: ",
        "kaudit project",
    )


def test_the_gate_refuses_a_dropped_repository_and_runs_nothing_it_records(
    genuine: Project,
    mallory: SigningKey,
    repo_templates: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    root = genuine.root
    marker = tmp_path / "mallory-ran"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    made = tmp_path / "mallory-repo"
    _forged_repository(made, repo_templates[1], mallory, command)
    shutil.move(made, root / "artifacts")
    done = run_cli("gate", "--trust-ref", TRUST_REF, cwd=root)
    assert_bad_input(done, " artifacts/.git: ")
    assert not marker.exists()  # the recorded command was never run
    as_json = run_cli("gate", "--json", "--trust-ref", TRUST_REF, cwd=root)
    assert as_json.exit_code == 2, as_json.output
    error = json.loads(as_json.stdout)
    assert error["path"] == str(root / "artifacts" / ".git")
    assert "another git repository" in error["error"]
    assert not marker.exists()


PROGRAM = textwrap.dedent(
    """
    import sys
    import numpy as np
    import kronos_audit as ka

    with ka.Run("victim", root="checkpoints", seed=1, every=ka.EverySteps(1)) as run:
        state = run.restore() or {"x": np.zeros(4)}
        for step in run.steps(int(sys.argv[1])):
            state = {"x": state["x"] + 1.0}
            run.checkpoint(step, state)
    """
)


def _program(root: Path, steps: int) -> subprocess.CompletedProcess[str]:
    (root / "victim.py").write_text(PROGRAM)
    return subprocess.run(
        [sys.executable, "victim.py", str(steps)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "default"},
    )


def _manifests(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.kaudit.json"))}


def test_run_refuses_a_run_directory_that_claims_to_be_its_project(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    root = project.root
    first = _program(root, 3)
    assert first.returncode == 0, first.stderr
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "steps 1-3")
    run_dir = root / "checkpoints" / "victim"
    before = _manifests(run_dir)
    assert len(before) == 3
    # The attacker's repository in the run directory: its own commit and kaudit config.
    git(run_dir, "init", "-q", "-b", "main")
    shutil.copytree(root / ".kaudit", run_dir / ".kaudit")
    git(run_dir, "add", ".kaudit")
    git(run_dir, "commit", "-q", "-m", "mine now")
    resumed = _program(root, 6)
    assert resumed.returncode != 0, resumed.stdout
    assert resumed.returncode == 2, resumed.stderr  # bad setup: one line, never retried
    (last,) = resumed.stderr.strip().splitlines()
    assert last.startswith("kaudit: error: "), resumed.stderr
    assert "another git repository inside" in last
    assert str(run_dir / ".git") in last
    assert _manifests(run_dir) == before  # nothing re-signed, nothing added
    # Taken away, the run resumes from its committed step 3 as its own project's.
    shutil.rmtree(run_dir / ".git")
    shutil.rmtree(run_dir / ".kaudit")
    again = _program(root, 6)
    assert again.returncode == 0, again.stderr
    after = _manifests(run_dir)
    assert {k: after[k] for k in before} == before
    assert sorted(after) == [f"step-{s:08d}.h5.kaudit.json" for s in range(1, 7)]


def test_a_genuine_submodule_is_verified_only_standing_in_it(
    genuine: Project,
    key: SigningKey,
    repo_templates: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    # The submodule's own repository, its run signed by tester, trusted at its main.
    lib = _project_copy(repo_templates[1], tmp_path / "lib")
    lib.trust_store().add(key.private_key.public_key(), "tester")
    ckpt = write_checkpoint(lib.root / "checkpoints" / "r" / "step-00000001.h5", 1)
    snapshot(ckpt, run="r", step=1, key=key)
    git(lib.root, "add", "-A")
    git(lib.root, "commit", "-q", "-m", "a run")
    root = genuine.root
    git(root, "-c", "protocol.file.allow=always", "submodule", "-q", "add", str(lib.root), "lib")
    git(root, "commit", "-q", "-m", "the library")
    sub = root / "lib"
    assert (sub / ".git").is_file()  # a submodule's gitfile
    shutil.copy2(ckpt, sub / "checkpoints" / "r")  # its data (DVC's, not git's)
    commit = git(sub, "rev-parse", TRUST_REF).strip()  # the clone's own origin/main
    run = "checkpoints/r"
    assert_bad_input(
        run_cli("verify", "--no-fetch", "--trust-ref", TRUST_REF, f"lib/{run}", cwd=root),
        " lib/.git: ",
        f"run kaudit from {sub}",
    )
    assert_bad_input(
        run_cli("verify", "--no-fetch", "--trust-ref", TRUST_REF, str(sub / run), cwd=tmp_path),
        f"run kaudit from {sub}",
    )
    inside = run_cli("verify", "--no-fetch", "--trust-ref", TRUST_REF, run, cwd=sub)
    assert inside.exit_code == 0, inside.output
    assert f"anchor: --trust-ref {TRUST_REF} at {commit}:" in inside.stdout


def test_a_submodules_objects_are_its_own_wherever_one_stands_in_it(
    genuine: Project,
    key: SigningKey,
    repo_templates: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    # A submodule's git directory names its work tree relatively (core.worktree =
    # ../../../lib); read from the process's directory instead of the git directory's,
    # that named another repository: here one at tmp_path/lib, which holds none of it.
    upstream = _project_copy(repo_templates[1], tmp_path / "upstream" / "lib")
    upstream.trust_store().add(key.private_key.public_key(), "tester")
    ckpt = write_checkpoint(upstream.root / "checkpoints" / "r" / "step-00000001.h5", 1)
    snapshot(ckpt, run="r", step=1, key=key)
    git(upstream.root, "add", "-A")
    git(upstream.root, "commit", "-q", "-m", "a run")
    root = genuine.root
    git(
        root,
        "-c",
        "protocol.file.allow=always",
        "submodule",
        "-q",
        "add",
        str(upstream.root),
        "lib",
    )
    sub = root / "lib"
    shutil.copy2(ckpt, sub / "checkpoints" / "r")
    _project_copy(repo_templates[0], tmp_path / "lib")  # another repository, where it pointed
    commit = git(sub, "rev-parse", TRUST_REF).strip()
    inside = run_cli("verify", "--no-fetch", "--trust-ref", TRUST_REF, "r", cwd=sub / "checkpoints")
    assert inside.exit_code == 0, inside.output
    assert f"anchor: --trust-ref {TRUST_REF} at {commit}:" in inside.stdout


def test_a_trust_store_that_cannot_be_read_at_the_ref_is_said_not_taken_for_empty(
    genuine: Project, key: SigningKey
) -> None:
    root = genuine.root
    ckpt = write_checkpoint(root / "checkpoints" / "heat" / "step-00000001.h5", 1)
    snapshot(ckpt, run="heat", step=1, key=key)
    tree = git(root, "rev-parse", f"{TRUST_REF}:.kaudit/trusted-keys").strip()
    loose = root / ".git" / "objects" / tree[:2] / tree[2:]
    assert loose.is_file()
    loose.unlink()  # the ref resolves; the store it holds cannot be read
    line = assert_bad_input(
        run_cli("verify", "--trust-ref", TRUST_REF, "checkpoints/heat", cwd=root),
        "cannot read",
        ".kaudit/trusted-keys",
    )
    assert "no trust anchor" not in line


def test_a_submodule_named_as_the_gates_repository_is_gated_in_it_replays_included(
    genuine: Project,
    key: SigningKey,
    repo_templates: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    # The submodule's own run, recorded by a program committed in it.
    lib = _project_copy(repo_templates[1], tmp_path / "upstream" / "lib")
    lib.trust_store().add(key.private_key.public_key(), "tester")
    (lib.root / "victim.py").write_text(PROGRAM)
    git(lib.root, "add", "-A")
    git(lib.root, "commit", "-q", "-m", "the program")
    recorded = _program(lib.root, 2)
    assert recorded.returncode == 0, recorded.stderr
    git(lib.root, "add", "-A")
    git(lib.root, "commit", "-q", "-m", "a run")
    root = genuine.root
    git(root, "-c", "protocol.file.allow=always", "submodule", "-q", "add", str(lib.root), "lib")
    sub = root / "lib"
    for h5 in (lib.root / "checkpoints" / "victim").glob("*.h5"):  # DVC's data, not git's
        shutil.copy2(h5, sub / "checkpoints" / "victim")
    done = run_cli("gate", "--json", "--trust-ref", TRUST_REF, "lib", cwd=root)
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert doc["trust_ref_resolved"]["commit"] == git(sub, "rev-parse", TRUST_REF).strip()
    replays = [c for c in doc["cases"] if c["kind"] == "replay"]
    assert len(replays) == 1, doc["cases"]
    assert replays[0]["ok"], replays
