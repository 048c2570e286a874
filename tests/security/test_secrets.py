"""Secrets stay out, attacked through the real CLI and ka.Run.

A password or token given to kaudit must never be printed, committed (``.dvc/config``,
``.kaudit/patches/``) or signed into a manifest; each test fails if its defence goes.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import Result

import kronos_audit as ka
from kronos_audit.checkpoint.layout import manifest_path_for
from kronos_audit.errors import UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.provenance.environment import environment
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.storage.remote import configure_remote
from tests.helpers import assert_bad_input, git, run_cli

SECRET = "s3cr3t-Tok3n"


def dvc_remote(root: Path, name: str = "storage") -> dict[str, object]:
    """The remote as DVC resolves it: .dvc/config merged with .dvc/config.local (without
    the defaults DVC's schema fills in)."""
    from dvc.repo import Repo

    return {k: v for k, v in Repo(str(root)).config["remote"][name].items() if k != "verify"}


def publishable_files(root: Path) -> list[Path]:
    """Every file git tracks or would track (`git add -A`): what a push publishes."""
    listed = git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    return [root / name for name in listed.split("\0") if name]


def assert_secret_not_published(root: Path, result: Result, *secrets: str) -> None:
    for s in secrets:
        assert s not in result.stdout, result.stdout
        assert s not in result.stderr, result.stderr
        for f in publishable_files(root):
            assert s.encode() not in f.read_bytes(), f
    git(root, "add", "-A")  # what the next commit would hold
    for s in secrets:
        grep = subprocess.run(["git", "grep", "--cached", "-q", "-F", s], cwd=root, check=False)
        assert grep.returncode == 1, f"{s!r} is in the index"


# -- kaudit init --remote --------------------------------------------------------------


def test_an_ssh_password_goes_to_the_local_config_only(git_repo: Path) -> None:
    result = run_cli("init", "--remote", f"ssh://u:{SECRET}@127.0.0.1/x", cwd=git_repo)
    assert result.exit_code == 0, result.output
    assert "storage = ssh://u:***@127.0.0.1/x (default)" in result.stdout
    assert ".dvc/config.local" in result.stdout
    assert_secret_not_published(git_repo, result, SECRET)
    assert "url = ssh://u@127.0.0.1/x" in (git_repo / ".dvc" / "config").read_text()

    local = git_repo / ".dvc" / "config.local"
    assert SECRET in local.read_text()
    assert stat.S_IMODE(local.stat().st_mode) == 0o600  # a password: its owner's only
    # DVC still connects with the password: it merges the two files.
    assert dvc_remote(git_repo) == {"url": "ssh://u@127.0.0.1/x", "password": SECRET}
    from dvc.fs import get_cloud_fs
    from dvc.repo import Repo

    cls, conf, _ = get_cloud_fs(Repo(str(git_repo)).config, name="storage")
    login = cls(**conf).fs_args
    assert (login["host"], login["username"], login["password"]) == ("127.0.0.1", "u", SECRET)


@pytest.mark.parametrize(
    ("url", "public", "local"),
    [
        (
            f"https://alice:{SECRET}@dvc.example/store",
            "https://dvc.example/store",
            {"user": "alice", "password": SECRET, "auth": "basic"},
        ),
        (  # a token as the user name: GitHub's and most HTTP services' convention
            f"https://ghp_{SECRET}@dvc.example/store",
            "https://dvc.example/store",
            {"user": f"ghp_{SECRET}", "password": "", "auth": "basic"},
        ),
        (
            f"webdavs://bob:{SECRET}@dav.example/remote.php/dvc",
            "webdavs://dav.example/remote.php/dvc",
            {"user": "bob", "password": SECRET},
        ),
    ],
)
def test_user_and_password_become_dvcs_own_local_options(
    git_repo: Path, url: str, public: str, local: dict[str, str]
) -> None:
    result = run_cli("init", "--remote", url, cwd=git_repo)
    assert result.exit_code == 0, result.output
    assert_secret_not_published(git_repo, result, SECRET)
    assert f"url = {public}" in (git_repo / ".dvc" / "config").read_text()
    assert dvc_remote(git_repo) == {"url": public, **local}


@pytest.mark.parametrize(
    ("url", "public", "shown"),
    [
        (
            f"s3://bucket/path?access_key=AKIAEXAMPLE&secret={SECRET}",
            "s3://bucket/path",
            "s3://bucket/path?access_key=***&secret=***",
        ),
        (
            "https://b.s3.amazonaws.com/dvc?X-Amz-Credential=AKIAEXAMPLE"
            f"&X-Amz-Signature={SECRET}&X-Amz-Expires=3600",
            "https://b.s3.amazonaws.com/dvc?X-Amz-Expires=3600",
            "https://b.s3.amazonaws.com/dvc?X-Amz-Credential=***&X-Amz-Signature=***"
            "&X-Amz-Expires=3600",
        ),
        (
            f"azure://container/dvc?sv=2022-11-02&sig={SECRET}",
            "azure://container/dvc?sv=2022-11-02",
            "azure://container/dvc?sv=2022-11-02&sig=***",
        ),
        (
            f"https://dvc.example/store?token={SECRET}",
            "https://dvc.example/store",
            "https://dvc.example/store?token=***",
        ),
    ],
)
def test_a_query_string_token_keeps_the_whole_url_in_the_local_config(
    git_repo: Path, url: str, public: str, shown: str
) -> None:
    result = run_cli("init", "--remote", url, cwd=git_repo)
    assert result.exit_code == 0, result.output
    assert f"storage = {shown} (default)" in result.stdout
    assert_secret_not_published(git_repo, result, SECRET, "AKIAEXAMPLE")
    assert f"url = {public}" in (git_repo / ".dvc" / "config").read_text()
    # DVC has no option for such a token: the local config's URL overrides the public one.
    assert dvc_remote(git_repo)["url"] == url


@pytest.mark.parametrize(
    "first", [f"https://dvc.example/a?token={SECRET}", f"https://alice:{SECRET}@dvc.example/a"]
)
def test_a_later_remote_is_not_shadowed_by_an_earlier_ones_credentials(
    git_repo: Path, first: str
) -> None:
    from dvc.repo import Repo

    assert run_cli("init", "--remote", first, cwd=git_repo).exit_code == 0
    with Repo(str(git_repo)).config.edit("local") as conf:  # dvc remote modify --local
        conf["remote"]["storage"]["ssl_verify"] = "/etc/ssl/dvc-ca.pem"
    # An earlier URL left in the local config would override this one, and an earlier
    # password would be sent to this host.
    second = run_cli("init", "--remote", "https://dvc.example/b", cwd=git_repo)
    assert second.exit_code == 0, second.output
    assert dvc_remote(git_repo) == {
        "url": "https://dvc.example/b",
        "ssl_verify": "/etc/ssl/dvc-ca.pem",  # the user's own local options stay
    }
    assert SECRET not in (git_repo / ".dvc" / "config.local").read_text()


def test_a_plain_url_is_kept_as_it_is(git_repo: Path, tmp_path: Path) -> None:
    result = run_cli("init", "--remote", "ssh://git@127.0.0.1/srv/dvc", cwd=git_repo)
    assert result.exit_code == 0, result.output
    assert "storage = ssh://git@127.0.0.1/srv/dvc (default)\n" in result.stdout
    assert dvc_remote(git_repo) == {"url": "ssh://git@127.0.0.1/srv/dvc"}
    assert not (git_repo / ".dvc" / "config.local").exists()


def test_credentials_are_refused_where_the_local_config_is_not_git_ignored(
    git_repo: Path,
) -> None:
    assert run_cli("init", cwd=git_repo).exit_code == 0
    ignore = git_repo / ".dvc" / ".gitignore"
    ignore.write_text(ignore.read_text().replace("/config.local\n", ""))
    before = (git_repo / ".dvc" / "config").read_bytes()
    result = run_cli("init", "--remote", f"ssh://u:{SECRET}@127.0.0.1/x", cwd=git_repo)
    assert_bad_input(result, "config.local", "not git-ignored", "/config.local")
    assert_secret_not_published(git_repo, result, SECRET)
    assert (git_repo / ".dvc" / "config").read_bytes() == before  # no remote half-added
    assert not (git_repo / ".dvc" / "config.local").exists()


def test_credentials_are_not_written_through_a_symlinked_local_config(git_repo: Path) -> None:
    assert run_cli("init", cwd=git_repo).exit_code == 0
    git(git_repo, "add", "-A")
    git(git_repo, "commit", "-q", "-m", "kaudit init")
    # Git ignores the name, but what it points at is tracked: writing through it publishes.
    (git_repo / "notes.txt").write_text("# notes\n")
    git(git_repo, "add", "notes.txt")
    (git_repo / ".dvc" / "config.local").symlink_to("../notes.txt")
    before = (git_repo / ".dvc" / "config").read_bytes()
    result = run_cli("init", "--remote", f"ssh://u:{SECRET}@127.0.0.1/x", cwd=git_repo)
    assert_bad_input(result, "config.local", "symbolic link")
    assert_secret_not_published(git_repo, result, SECRET)
    assert (git_repo / "notes.txt").read_text() == "# notes\n"
    assert (git_repo / ".dvc" / "config").read_bytes() == before  # the remote rolled back


def test_a_dvc_error_does_not_show_the_secret(git_repo: Path) -> None:
    result = run_cli("init", "--remote", f"gopher://u:{SECRET}@h.example/x", cwd=git_repo)
    assert_bad_input(result, "cannot add the DVC remote", "gopher")
    assert_secret_not_published(git_repo, result, SECRET)
    assert "gopher" not in (git_repo / ".dvc" / "config").read_text()
    assert not (git_repo / ".dvc" / "config.local").exists()


# -- kaudit snapshot: the git remote and the patch ---------------------------------------


def test_the_git_remote_is_signed_without_its_token(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    git(
        project.root,
        "remote",
        "add",
        "origin",
        f"https://oauth2:{SECRET}@gitlab.example/g/r.git?private_token={SECRET}",
    )
    result = run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1")
    assert result.exit_code == 0, result.output
    manifest = manifest_path_for(checkpoint)
    assert SECRET not in repr(read_manifest(manifest).statement)  # the decoded payload
    assert read_manifest(manifest).predicate["git"]["remote"] == "https://gitlab.example/g/r.git"
    assert SECRET not in run_cli("show", str(manifest)).stdout


def nothing_written(project: Project, checkpoint: Path) -> None:
    assert not manifest_path_for(checkpoint).exists()
    assert not checkpoint.with_name(checkpoint.name + ".dvc").exists()
    assert not (checkpoint.parent / ".gitignore").exists()
    assert list((project.root / ".kaudit" / "patches").iterdir()) == []


@pytest.mark.parametrize("name", [".env", "deploy/id_ed25519", "tls/server.pem", "ci.key"])
def test_snapshot_refuses_a_staged_secret_file(
    project: Project, key: SigningKey, checkpoint: Path, name: str
) -> None:
    secret = project.root / name
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text(f"TOKEN={SECRET}\n")
    git(project.root, "add", name)
    result = run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1")
    assert_bad_input(result, str(project.root / name), "--allow-secret-files", no_stdout=True)
    nothing_written(project, checkpoint)

    allowed = run_cli(
        "snapshot", str(checkpoint), "--run", "run1", "--step", "1", "--allow-secret-files"
    )
    assert allowed.exit_code == 0, allowed.output
    g = read_manifest(manifest_path_for(checkpoint)).predicate["git"]
    assert g["dirty"] is True
    patch = project.root / ".kaudit" / "patches" / f"{g['patch_sha256']}.patch"
    assert SECRET.encode() in patch.read_bytes()  # recorded, as asked


def test_snapshot_records_a_diff_without_secrets_as_before(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (project.root / ".env").write_text(f"TOKEN={SECRET}\n")  # untracked: in no diff
    (project.root / "solver.py").write_text("print('solve faster')\n")
    result = run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1")
    assert result.exit_code == 0, result.output
    g = read_manifest(manifest_path_for(checkpoint)).predicate["git"]
    patch = project.root / ".kaudit" / "patches" / f"{g['patch_sha256']}.patch"
    assert b"solve faster" in patch.read_bytes()
    assert SECRET.encode() not in patch.read_bytes()


# -- ka.Run -------------------------------------------------------------------------------


def test_run_refuses_a_staged_secret_file_before_writing_anything(
    project: Project, key: SigningKey
) -> None:
    (project.root / ".env").write_text(f"TOKEN={SECRET}\n")
    git(project.root, "add", ".env")
    root = project.root / "checkpoints"
    with (
        pytest.raises(UsageError, match="allow_secret_files=True") as info,
        ka.Run("sim", root=root, seed=1, asynchronous=False),
    ):
        pass
    assert info.value.path == project.root / ".env"
    assert not root.exists()
    assert list((project.root / ".kaudit" / "patches").iterdir()) == []

    with ka.Run("sim", root=root, seed=1, asynchronous=False, allow_secret_files=True) as run:
        for step in run.steps(1):
            run.checkpoint(step, {"u": np.zeros(4)})
    m = read_manifest(root / "sim" / "step-00000001.h5.kaudit.json")
    assert m.predicate["git"]["dirty"] is True


# -- environment variables -------------------------------------------------------------


@pytest.fixture
def fresh_environment() -> Iterator[None]:
    environment.cache_clear()
    yield
    environment.cache_clear()


def test_a_secret_behind_a_numeric_prefix_is_not_signed(
    project: Project,
    key: SigningKey,
    checkpoint: Path,
    monkeypatch: pytest.MonkeyPatch,
    fresh_environment: None,
) -> None:
    monkeypatch.setenv("OMP_SECRET_TOKEN", SECRET)
    monkeypatch.setenv("MKL_LICENSE", SECRET)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    result = run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1")
    assert result.exit_code == 0, result.output
    variables = read_manifest(manifest_path_for(checkpoint)).predicate["environment"]["variables"]
    assert variables["OMP_NUM_THREADS"] == "3"
    assert "OMP_SECRET_TOKEN" not in variables
    assert "MKL_LICENSE" not in variables
    assert SECRET not in run_cli("show", str(manifest_path_for(checkpoint))).stdout


def test_the_signed_manifest_holds_no_secret_from_the_environment(
    project: Project,
    key: SigningKey,
    checkpoint: Path,
    monkeypatch: pytest.MonkeyPatch,
    fresh_environment: None,
) -> None:
    for name in ("CUBLAS_API_KEY", "NUMEXPR_LICENSE", "KMP_PASSWORD", "CUDNN_TOKEN"):
        monkeypatch.setenv(name, SECRET)
    assert run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1").exit_code == 0
    statement = read_manifest(manifest_path_for(checkpoint)).statement
    assert SECRET not in repr(statement)
    assert os.environ["CUBLAS_API_KEY"] == SECRET  # it was there to be taken


# -- secrets in the content of the recorded patch ----------------------------------------


@pytest.mark.parametrize(
    ("name", "line"),
    [
        (".gitignore", f"AWS_SECRET_ACCESS_KEY={SECRET}-wJalrXUtnFEMI"),  # a dotenv line
        ("deploy/aws.ini", f"aws_secret_access_key = {SECRET}/K7MDENG"),  # ~/.aws/credentials
        ("scripts/ci.sh", f"export GITHUB_TOKEN=ghp_{SECRET}0123456789abcdefghijklmn"),
        ("notes.md", f"see xoxb-1234567890-{SECRET}"),  # a Slack token anywhere
        ("conf/db.yaml", f"url: postgres://app:{SECRET}@db.internal/prod"),
    ],
)
def test_a_patch_that_adds_a_secret_line_is_refused_whatever_the_file_is_called(
    project: Project, key: SigningKey, checkpoint: Path, name: str, line: str
) -> None:
    path = project.root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# committed\n")
    git(project.root, "add", name)
    git(project.root, "commit", "-q", "-m", "a tracked file")
    path.write_text(f"# committed\n{line}\n")  # the secret, one line below

    result = run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1")
    message = assert_bad_input(
        result, str(path), "line 2", "looks like a secret", "--allow-secret-files", no_stdout=True
    )
    assert SECRET not in message
    nothing_written(project, checkpoint)

    root = project.root / "checkpoints"
    with (
        pytest.raises(UsageError, match="allow_secret_files=True") as info,
        ka.Run("sim", root=root, seed=1, asynchronous=False),
    ):
        pass
    assert info.value.path == path
    assert not (root / "sim").exists()
    assert list((project.root / ".kaudit" / "patches").iterdir()) == []


def test_code_that_reads_a_secret_is_recorded_as_before(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    code = (
        "import os\n"
        'token = os.environ["API_TOKEN"]\n'
        "password = prompt()\n"
        "api_key: str\n"
        "max_tokens = 4096\n"
        "secret_key: str | None = None\n"
    )
    (project.root / "solver.py").write_text(code)
    (project.root / "run.sh").write_text("TOKEN=$CI_TOKEN\nexport PASSWORD=${DB_PASSWORD}\n")
    git(project.root, "add", "run.sh")
    result = run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1")
    assert result.exit_code == 0, result.output
    g = read_manifest(manifest_path_for(checkpoint)).predicate["git"]
    patch = project.root / ".kaudit" / "patches" / f"{g['patch_sha256']}.patch"
    assert b"max_tokens = 4096" in patch.read_bytes()


def test_a_patch_recorded_with_a_secret_is_never_pushed(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    remote = tmp_path / "remote"
    configure_remote(project, str(remote))
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "remote")
    (project.root / "solver.py").write_text(f"print('solve')\nAPI_TOKEN={SECRET}-0123456789\n")
    root = project.root / "checkpoints"
    with ka.Run("sim", root=root, seed=1, asynchronous=False, allow_secret_files=True) as run:
        for step in run.steps(1):
            run.checkpoint(step, {"u": np.zeros(4)})  # recorded, as asked
    assert list((project.root / ".kaudit" / "patches").iterdir())

    result = run_cli("push", str(root / "sim"), cwd=project.root)
    assert result.exit_code != 0, result.output
    assert "looks like a secret" in result.stderr
    assert "solver.py" in result.stderr
    assert SECRET not in result.output
    for path in remote.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
