"""DVC push/pull through a real sshd on 127.0.0.1 (tests/sshd.py), with the dvc CLI."""

from __future__ import annotations

import asyncio
import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import recorded_once
from tests.sshd import SSHRemote, run_dvc, unused_port

pytestmark = pytest.mark.slow

DATA = bytes(range(256)) * 16 + b"kronos-audit ssh smoke\n"


def _dvc_repo_with_data(repo: Path, factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`dvc init` + commit in the git repo, then `dvc add data.bin`; (file, md5). Done
    once for the session, by the dvc CLI in a copy of the first asking test's repo; each
    test's repo becomes a copy of the result."""

    def record(into: Path) -> None:
        made = into / "repo"
        shutil.copytree(repo, made, symlinks=True)
        run_dvc(made, "init", "-q")
        subprocess.run(["git", "add", "-A"], cwd=made, check=True, capture_output=True)
        subprocess.run(["git", "commit", "-q", "-m", "dvc init"], cwd=made, check=True)
        (made / "data.bin").write_bytes(DATA)
        run_dvc(made, "add", "-q", "data.bin")

    copy = recorded_once("dvc-repo-with-data", factory, record)
    shutil.rmtree(repo)
    shutil.move(copy / "repo", repo)
    data = repo / "data.bin"
    assert data.read_bytes() == DATA
    found = re.search(r"md5: ([0-9a-f]{32})", (repo / "data.bin.dvc").read_text())
    assert found, (repo / "data.bin.dvc").read_text()
    md5 = found.group(1)
    assert md5 == hashlib.md5(DATA).hexdigest()
    return data, md5


def test_push_pull_roundtrip(
    git_repo: Path,
    ssh_remote: SSHRemote,
    ssh_remote_dir: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    data, md5 = _dvc_repo_with_data(git_repo, tmp_path_factory)
    ssh_remote.configure_dvc(git_repo, "storage", ssh_remote_dir)

    run_dvc(git_repo, "push", "-q")
    pushed = ssh_remote.local_path(ssh_remote_dir) / "files" / "md5" / md5[:2] / md5[2:]
    assert pushed.read_bytes() == DATA

    data.unlink()
    shutil.rmtree(git_repo / ".dvc" / "cache")
    run_dvc(git_repo, "pull", "-q")
    assert data.read_bytes() == DATA


def test_push_to_unreachable_server_fails(
    git_repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.ssh of the user's
    data, md5 = _dvc_repo_with_data(git_repo, tmp_path_factory)
    port = unused_port()  # closed: nothing listens there
    run_dvc(git_repo, "remote", "add", "-d", "storage", f"ssh://127.0.0.1:{port}/nowhere")

    proc = run_dvc(git_repo, "push", check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    # it failed for the right reason (not, say, a missing dvc-ssh plugin)
    assert re.search(r"Connect call failed|Connection refused|Errno 111", out), out
    assert data.read_bytes() == DATA
    cached = git_repo / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]
    assert cached.read_bytes() == DATA


def test_known_hosts_pins_the_generated_host_key(ssh_remote: SSHRemote, tmp_path: Path) -> None:
    """The fixture's known_hosts is right for asyncssh (dvc-ssh's library, which checks when
    given known_hosts) and for OpenSSH with strict checking; a different key is refused."""
    asyncssh = pytest.importorskip("asyncssh")

    async def login(known_hosts: Path) -> str:
        async with asyncssh.connect(
            ssh_remote.host,
            port=ssh_remote.port,
            username=ssh_remote.user,
            client_keys=[str(ssh_remote.keyfile)],
            known_hosts=str(known_hosts),
            config=[],
            agent_path=None,
        ) as conn:
            result = await conn.run("echo ok", check=True)
            return str(result.stdout).strip()

    assert asyncio.run(login(ssh_remote.known_hosts)) == "ok"

    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = tmp_path / "known_hosts"
    key = other.with_name("other_key.pub").read_text().split()[:2]
    wrong.write_text(f"[{ssh_remote.host}]:{ssh_remote.port} {' '.join(key)}\n")
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        asyncio.run(login(wrong))

    if shutil.which("ssh"):
        assert _openssh(ssh_remote, ssh_remote.known_hosts, "echo", "ok").stdout.strip() == "ok"
        bad = _openssh(ssh_remote, wrong, "true", check=False)
        assert bad.returncode != 0
        assert "Host key verification failed" in bad.stderr


def _openssh(
    remote: SSHRemote, known_hosts: Path, *command: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` on the server with the OpenSSH client and strict host-key checking."""
    argv = ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    argv += ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "IdentitiesOnly=yes"]
    argv += ["-i", str(remote.keyfile), "-p", str(remote.port), f"{remote.user}@{remote.host}"]
    proc = subprocess.run(
        [*argv, *command], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc
