"""Fixtures for storage tests: a DVC directory remote, and a private sshd on 127.0.0.1
usable as a DVC ssh:// remote.

- ``remote`` (function): a directory remote made the project's default with
  ``configure_remote`` and committed; returns its path.

- ``ssh_remote`` (session): an `sshd.SSHRemote` (url, host, port, user, keyfile,
  known_hosts, home, root; url_for, local_path, new_dir, env, configure_dvc).
- ``ssh_remote_dir`` (function): a fresh, empty server-side directory; returns its
  ssh:// URL, and sets HOME for the test to ``ssh_remote.home`` (known_hosts for this
  server, none of the user's ~/.ssh). Note: dvc-ssh itself never checks host keys (see
  tests/sshd.py); the known_hosts file serves OpenSSH clients and asyncssh.

When no server can be started, the tests that use them are skipped with the reason
(set KAUDIT_REQUIRE_SSHD=1 to make that a failure instead, e.g. in CI).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from kronos_audit.project.repository import Project
from kronos_audit.storage.remote import configure_remote
from tests import sshd
from tests.helpers import git


@pytest.fixture
def remote(project: Project, tmp_path: Path) -> Path:
    """A DVC directory remote, the project's default, committed."""
    path = tmp_path / "remote"
    configure_remote(project, str(path))
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "remote")
    return path


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("KAUDIT_REQUIRE_SSHD") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def ssh_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sshd.SSHServer]:
    if importlib.util.find_spec("dvc_ssh") is None:
        _unavailable("dvc-ssh is not installed: pip install -e '.[ssh]' (or '.[test]')")
    try:
        server = sshd.start_sshd(tmp_path_factory.mktemp("sshd"))
    except sshd.SSHDUnavailable as exc:
        _unavailable(f"private sshd unavailable: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def ssh_remote(ssh_server: sshd.SSHServer) -> sshd.SSHRemote:
    return ssh_server.remote


@pytest.fixture
def ssh_remote_dir(
    ssh_remote: sshd.SSHRemote, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> str:
    monkeypatch.setenv("HOME", str(ssh_remote.home))
    return ssh_remote.new_dir(request.node.name)
