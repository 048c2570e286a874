"""A remote's credentials go only to the URL they were given for, and switching remotes
leaves none behind: real DVC, real git, a real HTTP server on 127.0.0.1 in the role of
the host a commit points the remote at."""

from __future__ import annotations

import base64
import gc
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from click.testing import Result

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey
from tests.helpers import assert_bad_input, git, run_cli, write_checkpoint

USER, PASSWORD = "owner", "pw-0f-the-owner"
# aiohttp deprecates the BasicAuth DVC's HTTP remote still uses; a warning made an error
# would stop DVC before it sends anything, and hide what it sends.
pytestmark = [
    pytest.mark.filterwarnings("ignore:BasicAuth is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The .auth. parameter is deprecated:DeprecationWarning"),
    # DVC leaves its aiohttp session to the garbage collector after a failed request.
    pytest.mark.filterwarnings("ignore:Unclosed client session:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


@dataclass
class Recorder:
    """What an HTTP server was sent: each request's method, path and Authorization."""

    port: int
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)

    def authorizations(self) -> list[str]:
        return [a for _, _, a in self.requests if a is not None]


def _handler(recorder: Recorder) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def _record(self) -> None:
            recorder.requests.append((self.command, self.path, self.headers.get("Authorization")))
            # Asking for credentials is what a host after a password does.
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="x"')
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = do_POST = do_PUT = do_PROPFIND = _record

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def attacker() -> Iterator[Recorder]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    recorder = Recorder(server.server_address[1])
    server.RequestHandlerClass = _handler(recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()


def unused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def moved(git_repo: Path, key: SigningKey, attacker: Recorder) -> Path:
    """The owner's remote with its credentials, a signed checkpoint, then a commit that
    moves the tracked URL to the attacker's host. Returns the checkpoint."""
    owner_port = unused_port()
    url = f"http://{USER}:{PASSWORD}@127.0.0.1:{owner_port}/x"
    assert run_cli("init", "--remote", url, cwd=git_repo).exit_code == 0
    checkpoint = write_checkpoint(git_repo / "checkpoints" / "run1" / "step-1.h5", seed=1)
    result = run_cli("snapshot", str(checkpoint), "--run", "run1", "--step", "1", cwd=git_repo)
    assert result.exit_code == 0, result.output
    git(git_repo, "add", "-A")
    git(git_repo, "commit", "-q", "-m", "owner")
    config = git_repo / ".dvc" / "config"
    config.write_text(
        config.read_text().replace(f"127.0.0.1:{owner_port}", f"127.0.0.1:{attacker.port}")
    )
    git(git_repo, "commit", "-q", "-am", "a commit that only moves the remote")
    return checkpoint


@pytest.fixture
def key(git_repo: Path) -> SigningKey:
    from kronos_audit.keys.home import generate_key

    return generate_key("owner")  # in the user's trust store: an anchor


def assert_refused_and_nothing_sent(result: Result, attacker: Recorder) -> None:
    assert BASIC not in attacker.authorizations(), "the owner's password went to the attacker"
    assert attacker.requests == []  # refused before DVC connects anywhere
    line = assert_bad_input(
        result, "'storage'", f"127.0.0.1:{attacker.port}", "kaudit init --remote"
    )
    assert PASSWORD not in line


def test_push_sends_no_password_to_a_host_a_commit_names(
    git_repo: Path, moved: Path, attacker: Recorder
) -> None:
    result = run_cli("push", cwd=git_repo)
    assert_refused_and_nothing_sent(result, attacker)


def test_pull_and_verify_fetch_nothing_from_a_host_a_commit_names(
    git_repo: Path, moved: Path, attacker: Recorder
) -> None:
    moved.unlink()  # missing here and in DVC's cache: both would fetch it
    shutil.rmtree(git_repo / ".dvc" / "cache")
    manifest = str(moved) + ".kaudit.json"
    assert_refused_and_nothing_sent(run_cli("pull", manifest, cwd=git_repo), attacker)
    assert_refused_and_nothing_sent(run_cli("verify", manifest, cwd=git_repo), attacker)
    assert not moved.exists()


def test_a_run_pushes_nothing_to_a_host_a_commit_names(
    git_repo: Path, moved: Path, attacker: Recorder, key: SigningKey
) -> None:
    with ka.Run("run2", root=git_repo / "checkpoints", seed=1, push=True) as run:
        for step in run.steps(2):
            run.checkpoint(step, {"u": np.full(4, float(step))})
    assert BASIC not in attacker.authorizations(), "the owner's password went to the attacker"
    assert attacker.requests == []
    assert run.push_failures, "the push was not refused"
    assert all(f"127.0.0.1:{attacker.port}" in f for f in run.push_failures)
    assert all("\n" not in f and PASSWORD not in f for f in run.push_failures)


def test_init_again_accepts_the_new_url(git_repo: Path, moved: Path, attacker: Recorder) -> None:
    new = f"http://{USER}:{PASSWORD}@127.0.0.1:{attacker.port}/x"
    assert run_cli("init", "--remote", new, cwd=git_repo).exit_code == 0
    # Now the owner has said this host gets the password: asking it what it holds sends
    # it (a push's upload would be cut off by the host's 401 answer).
    result = run_cli("status", cwd=git_repo)
    assert BASIC in attacker.authorizations(), result.output
    gc.collect()  # DVC's HTTP session left open by the failure: its warning counted here


def test_credentials_set_by_hand_without_a_url_are_not_sent(
    git_repo: Path, moved: Path, attacker: Recorder
) -> None:
    local = git_repo / ".dvc" / "config.local"
    # `dvc remote modify --local storage password ...` with no URL beside it.
    text = local.read_text()
    local.write_text("\n".join(line for line in text.splitlines() if "url" not in line) + "\n")
    result = run_cli("push", cwd=git_repo)
    assert BASIC not in attacker.authorizations(), "the owner's password went to the attacker"
    assert attacker.requests == []
    line = assert_bad_input(result, "'storage'", "bound to no URL", "url URL")
    assert PASSWORD not in line


def test_global_credentials_go_only_to_their_url(
    git_repo: Path, moved: Path, attacker: Recorder, tmp_path: Path
) -> None:
    (git_repo / ".dvc" / "config.local").unlink()
    owner = f"http://127.0.0.1:{unused_port()}/x"
    assert dvc(git_repo, "remote", "add", "--global", "storage", owner).returncode == 0
    for option, value in (("auth", "basic"), ("user", USER), ("password", PASSWORD)):
        done = dvc(git_repo, "remote", "modify", "--global", "storage", option, value)
        assert done.returncode == 0, done.stderr
    result = run_cli("push", cwd=git_repo)
    assert BASIC not in attacker.authorizations(), "the owner's password went to the attacker"
    assert attacker.requests == []
    line = assert_bad_input(result, "'storage'", f"127.0.0.1:{attacker.port}", owner)
    assert PASSWORD not in line


# -- switching remotes -----------------------------------------------------------------


def dvc(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A wide terminal: DVC wraps its tables at the terminal's width, which would split a
    # long remote path (a test's temporary directory) over two lines.
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args],
        cwd=repo,
        env={**os.environ, "COLUMNS": "1000"},
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    "first", [f"ssh://u:{PASSWORD}@127.0.0.1/x", f"http://u:{PASSWORD}@h.example/x"]
)
def test_switching_to_a_plain_remote_leaves_no_credentials(
    git_repo: Path, tmp_path: Path, first: str
) -> None:
    assert run_cli("init", "--remote", first, cwd=git_repo).exit_code == 0
    local = git_repo / ".dvc" / "config.local"
    with local.open("a") as f:  # an option of the ssh/http remote set by hand
        f.write("    ssl_verify = false\n" if first.startswith("http") else "    port = 2222\n")
    plain = tmp_path / "plain-remote"
    result = run_cli("init", "--remote", str(plain), cwd=git_repo)
    assert result.exit_code == 0, result.output
    assert PASSWORD not in local.read_text()
    listed = dvc(git_repo, "remote", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == ["storage", str(plain), "(default)"]
    status = dvc(git_repo, "status", "-c")
    assert status.returncode == 0, status.stderr
