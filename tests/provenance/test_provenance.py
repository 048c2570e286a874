"""The environment lock and the git state (kronos_audit.provenance.environment)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kronos_audit._internal.secrets import strip_credentials
from kronos_audit.errors import ProjectError, UsageError
from kronos_audit.provenance.environment import (
    NUMERIC_ENV_NAMES,
    environment,
    numeric_environment_variables,
)
from kronos_audit.provenance.gitstate import RECORD_PATHSPECS, git_state, git_tracked, patch_path
from tests.helpers import git, write_checkpoint


@pytest.fixture
def fresh_environment() -> Iterator[None]:
    """Clear the per-process cache around a test that changes the environment."""
    environment.cache_clear()
    yield
    environment.cache_clear()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "https://alice:ghp_s3cr3t@github.com/org/repo.git",
            "https://github.com/org/repo.git",
        ),
        ("https://ghp_s3cr3t@github.com/org/repo.git", "https://github.com/org/repo.git"),
        ("http://user:pw@example.com:8080/r.git", "http://example.com:8080/r.git"),
        ("ssh://alice:hunter2@host.example/srv/repo.git", "ssh://alice@host.example/srv/repo.git"),
        ("ssh://git@host.example/srv/repo.git", "ssh://git@host.example/srv/repo.git"),
        ("git@github.com:org/repo.git", "git@github.com:org/repo.git"),
        ("/srv/git/repo.git", "/srv/git/repo.git"),
        ("../sibling-repo", "../sibling-repo"),
        ("file:///srv/git/repo.git", "file:///srv/git/repo.git"),
        ("https://github.com/org/repo.git", "https://github.com/org/repo.git"),
        # Tokens in the userinfo of any scheme, and in query strings and fragments.
        ("https://oauth2:glpat-s3cr3t@gitlab.com/g/r.git", "https://gitlab.com/g/r.git"),
        ("git+https://ghp_s3cr3t@github.com/o/r.git", "git+https://github.com/o/r.git"),
        ("ssh://ghp_s3cr3t@host.example/r.git", "ssh://host.example/r.git"),
        ("ssh://x-token:hunter2@host.example/r.git", "ssh://x-token@host.example/r.git"),
        ("alice:hunter2@host.example:srv/repo.git", "alice@host.example:srv/repo.git"),
        ("https://h.example/r.git?private_token=s3cr3t", "https://h.example/r.git"),
        (
            "https://h.example/r.git?ref=main&access_token=s3cr3t&depth=1",
            "https://h.example/r.git?ref=main&depth=1",
        ),
        (
            "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAX&X-Amz-Signature=s3cr3t",
            "https://b.s3.amazonaws.com/k",
        ),
        (
            "https://acct.blob.core.windows.net/c?sv=2022&sig=s3cr3t",
            "https://acct.blob.core.windows.net/c?sv=2022",
        ),
        ("https://h.example/r#access_token=s3cr3t&state=x", "https://h.example/r#state=x"),
        ("https://h.example/r?key=s3cr3t&secret=hunter2&password=pw", "https://h.example/r"),
        ("https://h.example/r?ghp_s3cr3t", "https://h.example/r"),
        ("https://h.example/r.git#main", "https://h.example/r.git#main"),
        ("s3://bucket/path?versionId=3", "s3://bucket/path?versionId=3"),
    ],
)
def test_strip_credentials(url: str, expected: str) -> None:
    stripped = strip_credentials(url)
    assert stripped == expected
    for secret in ("ghp_s3cr3t", "s3cr3t", "hunter2", ":pw@", "=pw", "AKIAX"):
        assert secret not in stripped


def test_git_state_of_a_clean_repository(git_repo: Path) -> None:
    state = git_state(git_repo)
    assert state.commit == git(git_repo, "rev-parse", "HEAD").strip()
    assert state.branch == "main"
    assert state.dirty is False
    assert state.patch_sha256 is None
    assert state.remote is None
    assert not (git_repo / ".kaudit" / "patches").exists()
    assert state.to_json_obj() == {
        "commit": state.commit,
        "branch": "main",
        "dirty": False,
        "patch_sha256": None,
        "remote": None,
    }


def test_a_modified_tracked_file_stores_a_patch_that_applies(
    git_repo: Path, tmp_path: Path
) -> None:
    (git_repo / "solver.py").write_text("print('solve faster')\n")
    (git_repo / "data.bin").write_bytes(bytes(range(256)))
    git(git_repo, "add", "data.bin")  # staged binary changes belong in the patch too
    state = git_state(git_repo)
    assert state.dirty is True
    assert state.patch_sha256 is not None
    stored = patch_path(git_repo, state.patch_sha256)
    assert stored == git_repo / ".kaudit" / "patches" / f"{state.patch_sha256}.patch"
    patch = stored.read_bytes()
    assert hashlib.sha256(patch).hexdigest() == state.patch_sha256
    assert b"solve faster" in patch
    assert b"GIT binary patch" in patch

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(git_repo), str(clone)], check=True)
    git(clone, "checkout", "-q", state.commit)
    git(clone, "apply", "--check", str(stored))
    git(clone, "apply", str(stored))
    assert (clone / "solver.py").read_text() == "print('solve faster')\n"
    assert (clone / "data.bin").read_bytes() == bytes(range(256))

    # The same diff again is the same record, not a second file.
    assert git_state(git_repo).patch_sha256 == state.patch_sha256
    assert len(list(stored.parent.iterdir())) == 1


@pytest.mark.parametrize("planted", ["link", "fifo"])
def test_a_name_planted_where_the_patch_goes_is_replaced_never_written_through(
    git_repo: Path, tmp_path: Path, planted: str
) -> None:
    """A patch's name is its sha256, which anyone who knows the change can compute: a
    link planted there (to the owner's file) or a FIFO is not taken for the recorded
    patch, nor written through; the patch's bytes take its place as a regular file."""
    (git_repo / "solver.py").write_text("print('solve faster')\n")
    digest = git_state(git_repo).patch_sha256
    assert digest is not None
    stored = patch_path(git_repo, digest)
    patch = stored.read_bytes()
    owners = tmp_path / "owners-file"
    owners.write_text("the owner's own\n")
    stored.unlink()
    if planted == "link":
        stored.symlink_to(owners)
    else:
        os.mkfifo(stored)

    assert git_state(git_repo).patch_sha256 == digest
    assert not stored.is_symlink()
    assert stored.is_file()
    assert stored.read_bytes() == patch
    assert owners.read_text() == "the owner's own\n"


def _dirty_with_text_and_binary(repo: Path) -> None:
    (repo / "solver.py").write_text("print('solve faster')\n")
    (repo / "data.bin").write_bytes(bytes(range(256)) + b"no newline at the end")
    git(repo, "add", "data.bin")


def test_the_patch_is_byte_for_byte_what_git_diff_writes(git_repo: Path) -> None:
    _dirty_with_text_and_binary(git_repo)
    state = git_state(git_repo)
    assert state.patch_sha256 is not None
    expected = subprocess.run(
        ["git", "diff", "HEAD", "--binary", "--", ".", *RECORD_PATHSPECS],
        cwd=git_repo,
        check=True,
        capture_output=True,
    ).stdout
    assert expected.endswith(b"\n")
    assert patch_path(git_repo, state.patch_sha256).read_bytes() == expected
    assert state.patch_sha256 == hashlib.sha256(expected).hexdigest()


@pytest.mark.parametrize(
    "config",
    [
        ("color.ui", "always"),  # ANSI codes in the patch
        ("color.diff", "always"),
        ("diff.noprefix", "true"),  # no a/ b/: git apply -p1 misreads every path
        ("diff.mnemonicPrefix", "true"),  # i/ w/ c/ instead of a/ b/
        ("diff.external", "/bin/false"),  # an empty patch for a dirty tree
        ("diff.upper.textconv", "tr a-z A-Z <"),  # solver.py converted, not diffed
    ],
    ids=lambda c: "=".join(c),
)
def test_the_users_diff_settings_do_not_change_the_patch(
    git_repo: Path, tmp_path: Path, config: tuple[str, str]
) -> None:
    (git_repo / ".gitattributes").write_text("solver.py diff=upper\n")
    git(git_repo, "add", ".gitattributes")
    git(git_repo, "commit", "-q", "-m", "a diff driver for solver.py")
    _dirty_with_text_and_binary(git_repo)
    plain = git_state(git_repo).patch_sha256
    assert plain is not None
    for stored in (git_repo / ".kaudit" / "patches").iterdir():
        stored.unlink()

    git(git_repo, "config", *config)
    state = git_state(git_repo)
    assert state.patch_sha256 == plain
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(git_repo), str(clone)], check=True)
    git(clone, "checkout", "-q", state.commit)
    git(clone, "apply", str(patch_path(git_repo, plain)))
    assert (clone / "solver.py").read_text() == "print('solve faster')\n"


def test_a_private_key_is_found_whatever_textconv_shows(git_repo: Path) -> None:
    (git_repo / ".gitattributes").write_text("*.txt diff=hide\n")
    git(git_repo, "add", ".gitattributes")
    git(git_repo, "commit", "-q", "-m", "a diff driver for text files")
    git(git_repo, "config", "diff.hide.textconv", "tr -d - <")  # hides the PEM markers
    (git_repo / "notes.txt").write_text(
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk=\n-----END OPENSSH PRIVATE KEY-----\n"
    )
    git(git_repo, "add", "notes.txt")
    with pytest.raises(UsageError, match="PEM private key"):
        git_state(git_repo)


def test_git_tracked_takes_paths_relative_to_the_current_directory(
    git_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = git_repo / "sub"
    sub.mkdir()
    write_checkpoint(sub / "step-1.h5")
    write_checkpoint(sub / "step-2.h5")
    git(git_repo, "add", "sub/step-1.h5")
    monkeypatch.chdir(sub)
    assert git_tracked(git_repo, [Path("step-1.h5"), Path("step-2.h5")]) == [Path("step-1.h5")]
    assert git_tracked(git_repo, [sub / "step-2.h5", sub / "step-1.h5"]) == [sub / "step-1.h5"]


def test_checkpoints_and_kaudit_records_do_not_make_the_tree_dirty(git_repo: Path) -> None:
    manifest = git_repo / "checkpoints" / "step-1.h5.kaudit.json"
    manifest.parent.mkdir()
    manifest.write_text("{}\n")
    git(git_repo, "add", str(manifest))
    git(git_repo, "commit", "-q", "-m", "a tracked manifest")
    write_checkpoint(git_repo / "checkpoints" / "step-1.h5")  # untracked
    manifest.write_text('{"changed": true}\n')  # tracked and modified
    (git_repo / ".kaudit" / "patches").mkdir(parents=True)
    (git_repo / ".kaudit" / "patches" / "x.patch").write_text("diff\n")
    (git_repo / "untracked-notes.txt").write_text("scratch\n")
    state = git_state(git_repo)
    assert state.dirty is False
    assert state.patch_sha256 is None


def test_detached_head_has_no_branch(git_repo: Path) -> None:
    head = git(git_repo, "rev-parse", "HEAD").strip()
    git(git_repo, "checkout", "-q", "--detach")
    state = git_state(git_repo)
    assert state.branch is None
    assert state.commit == head


def test_remote_is_recorded_without_credentials(git_repo: Path) -> None:
    git(git_repo, "remote", "add", "backup", "https://bob:tok@example.com/b.git")
    assert git_state(git_repo).remote == "https://example.com/b.git"  # the only remote
    git(git_repo, "remote", "add", "origin", "https://alice:tok@example.com/o.git")
    assert git_state(git_repo).remote == "https://example.com/o.git"  # origin wins
    git(git_repo, "remote", "set-url", "origin", "https://example.com/o.git?private_token=tok")
    assert git_state(git_repo).remote == "https://example.com/o.git"
    git(git_repo, "remote", "set-url", "origin", "https://ghp_tok@github.com/o.git")
    assert git_state(git_repo).remote == "https://github.com/o.git"


def test_without_origin_the_first_remote_is_the_first_configured(git_repo: Path) -> None:
    git(git_repo, "remote", "add", "zeta", "https://zeta.example/z.git")
    git(git_repo, "remote", "add", "alpha", "https://alpha.example/a.git")
    assert git_state(git_repo).remote == "https://zeta.example/z.git"  # not sorted by name


def test_the_remote_url_is_recorded_as_git_rewrites_it(git_repo: Path) -> None:
    git(git_repo, "remote", "add", "origin", "gh:org/repo.git")
    git(git_repo, "config", "url.https://tok@github.com/.insteadOf", "gh:")
    assert git_state(git_repo).remote == "https://github.com/org/repo.git"


def test_a_repository_without_commits_is_refused(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q", "-b", "main")
    with pytest.raises(ProjectError, match="no commit yet") as info:
        git_state(tmp_path)
    assert info.value.path == tmp_path


def test_a_directory_outside_git_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProjectError, match="cannot read git state"):
        git_state(tmp_path)


def test_environment_is_captured_once_per_process(fresh_environment: None) -> None:
    assert environment() is environment()


def test_environment_records_numeric_variables_and_a_digest_of_the_rest(
    monkeypatch: pytest.MonkeyPatch, fresh_environment: None
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    monkeypatch.setenv("KAUDIT_UNRELATED", "not numeric")
    environment.cache_clear()
    env = environment()
    assert env["variables"]["OMP_NUM_THREADS"] == "3"
    assert env["variables"]["PYTHONHASHSEED"] == "0"
    assert "KAUDIT_UNRELATED" not in env["variables"]
    assert "HOME" not in env["variables"]
    assert env["variables"] == numeric_environment_variables()
    assert env["python"]["executable"] == sys.executable
    assert env["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert "numpy" in env["packages"]
    assert "h5py" in env["packages"]
    rest = {k: v for k, v in env.items() if k != "digest"}
    canonical = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert env["digest"] == hashlib.sha256(canonical.encode()).hexdigest()

    # The cache holds until cleared: a later change is not seen, then is.
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert environment()["variables"]["OMP_NUM_THREADS"] == "3"
    environment.cache_clear()
    changed = environment()
    assert changed["variables"]["OMP_NUM_THREADS"] == "5"
    assert changed["digest"] != env["digest"]


def test_environment_variables_are_recorded_by_name_not_by_prefix(
    monkeypatch: pytest.MonkeyPatch, fresh_environment: None
) -> None:
    # Prefixes of numeric libraries, but no numeric meaning: a licence key, a token.
    for name in (
        "OMP_SECRET_TOKEN",
        "MKL_LICENSE",
        "MKL_LICENSE_TOKEN",
        "CUBLAS_API_KEY",
        "OPENBLAS_VERBOSE",
        "KMP_SETTINGS_PASSWORD",
        "CUDNN_LOGDEST_DBG",
    ):
        monkeypatch.setenv(name, "s3cr3t")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    variables = environment()["variables"]
    assert variables["OMP_NUM_THREADS"] == "2"
    assert variables["MKL_CBWR"] == "COMPATIBLE"
    assert variables["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "s3cr3t" not in json.dumps(environment())
    assert set(variables) <= NUMERIC_ENV_NAMES


@pytest.mark.parametrize(
    "name",
    [
        ".env",
        ".env.production",
        "config/server.pem",
        "tls.key",
        "id_ed25519",
        "id_rsa_work",
        "deploy/id_ecdsa",
        "keystore.p12",
        "cert.pfx",
        "credentials.json",
        "gcp/credentials-prod.json",
        ".netrc",
        ".pgpass",
        ".git-credentials",
    ],
)
def test_a_new_secret_looking_file_is_not_put_into_a_patch(git_repo: Path, name: str) -> None:
    secret = git_repo / name
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text("API_TOKEN=s3cr3t\n")
    git(git_repo, "add", name)
    (git_repo / "solver.py").write_text("print('solve faster')\n")
    with pytest.raises(UsageError, match="allow-secret-files") as info:
        git_state(git_repo)
    assert info.value.path == git_repo / name
    assert f"git rm --cached -- {name}" in info.value.message
    assert not (git_repo / ".kaudit" / "patches").exists()

    state = git_state(git_repo, allow_secret_files=True)  # the user says it is no secret
    assert state.patch_sha256 is not None
    assert b"s3cr3t" in patch_path(git_repo, state.patch_sha256).read_bytes()


def test_a_file_added_with_intent_to_add_counts_too(git_repo: Path) -> None:
    (git_repo / ".env").write_text("TOKEN=s3cr3t\n")
    git(git_repo, "add", "--intent-to-add", ".env")  # in `git diff HEAD`, not staged
    with pytest.raises(UsageError, match=r"named like \.env"):
        git_state(git_repo)
    assert not (git_repo / ".kaudit" / "patches").exists()


def test_a_private_key_under_any_name_is_not_put_into_a_patch(git_repo: Path) -> None:
    (git_repo / "notes.txt").write_text(
        "deploy with:\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk=\n"
        "-----END OPENSSH PRIVATE KEY-----\n"
    )
    git(git_repo, "add", "notes.txt")
    with pytest.raises(UsageError, match="PEM private key") as info:
        git_state(git_repo)
    assert info.value.path == git_repo / "notes.txt"
    assert not (git_repo / ".kaudit" / "patches").exists()


def test_a_committed_secret_file_that_changes_is_refused_and_one_deleted_is_not(
    git_repo: Path,
) -> None:
    (git_repo / ".env").write_text("TOKEN=old\n")
    git(git_repo, "add", ".env")
    git(git_repo, "commit", "-q", "-m", "an .env committed long ago")
    # Its change may be a new secret (a rotated token): the old one being in the history
    # is no reason to record the new one.
    (git_repo / ".env").write_text("TOKEN=rotated-s3cr3t\n")
    with pytest.raises(UsageError, match="commit or revert its change") as info:
        git_state(git_repo)
    assert info.value.path == git_repo / ".env"
    assert not (git_repo / ".kaudit" / "patches").exists()
    # Deleting it publishes nothing new.
    git(git_repo, "rm", "-q", "-f", ".env")
    assert git_state(git_repo).dirty is True


@pytest.mark.parametrize(
    "name", [".env.example", "id_ed25519.pub", "keys.py", "id_utils.py", "docs/pem.md"]
)
def test_files_that_only_resemble_secrets_are_recorded(git_repo: Path, name: str) -> None:
    path = git_repo / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("TOKEN=\n")
    git(git_repo, "add", name)
    state = git_state(git_repo)
    assert state.patch_sha256 is not None
