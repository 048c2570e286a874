"""A private OpenSSH server on 127.0.0.1 for tests that use DVC ``ssh://`` remotes.

`start_sshd` runs ``/usr/sbin/sshd -D -e`` as a child process with everything in one
temp directory: its own sshd_config, a fresh ed25519 host key, a fresh ed25519 client
key pair whose public half is the only authorized key, a free port picked at run time,
``ListenAddress 127.0.0.1``, no passwords. It logs in as the current user.

Host keys and dvc-ssh: dvc-ssh does NOT verify the server's host key, whatever is in
known_hosts. It connects through sshfs, whose SSHFileSystem calls ``asyncssh.connect``
with ``known_hosts=None`` (checking off) unless given another value; dvc-ssh never passes
one, and DVC's ``ssh`` remote schema (``dvc/config_schema.py``: port, user, password,
keyfile, passphrase, timeout, gss_auth, allow_agent, max_sessions, ...) has no option that
could. So there is no way, through DVC configuration, to make it trust only this key.
The server still writes ``[127.0.0.1]:PORT ssh-ed25519 ...`` to ``.ssh/known_hosts`` in a
private home (`SSHRemote.home`, `SSHRemote.known_hosts`): OpenSSH clients use it with
``-o UserKnownHostsFile=...``, asyncssh with ``known_hosts=...``, and asyncssh's default
(no explicit known_hosts) reads exactly ``$HOME/.ssh/known_hosts``, so the tests keep
working if dvc-ssh ever turns checking on. Running DVC with ``HOME`` there
(`SSHRemote.env`, or the ``ssh_remote_dir`` fixture, which sets it for the test) also
keeps the user's own ``~/.ssh/config`` and default keys, which asyncssh would read, out
of the tests.

The pytest fixtures live in ``tests/storage/conftest.py``; this module holds the logic.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

HOST = "127.0.0.1"
ENSURE_SSHD = Path(__file__).resolve().parents[1] / "scripts" / "ensure-sshd.sh"
START_TIMEOUT = 15.0  # seconds for sshd to accept connections
STOP_TIMEOUT = 5.0


class SSHDUnavailable(RuntimeError):
    """The private sshd could not be started; the message says why."""


def unused_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of the call)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def run_dvc(
    repo: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """``python -m dvc ARGS`` in ``repo`` with this interpreter (the venv's dvc)."""
    proc = subprocess.run(
        [sys.executable, "-m", "dvc", *args],
        cwd=repo,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"dvc {' '.join(args)} exited {proc.returncode} in {repo}:\n{proc.stdout}{proc.stderr}"
        )
    return proc


@dataclass(frozen=True)
class SSHRemote:
    """What a test needs to use the private sshd as a DVC remote."""

    url: str  # ssh://127.0.0.1:PORT/<root>: the session-wide remote directory
    host: str
    port: int
    user: str
    keyfile: Path  # the client's private key (no passphrase)
    known_hosts: Path  # "[127.0.0.1]:PORT ssh-ed25519 ..." for the generated host key
    home: Path  # a HOME whose .ssh/known_hosts is `known_hosts` (and no other ssh config)
    root: Path  # the server-side directory behind `url` (same machine)

    def url_for(self, path: Path | str) -> str:
        """The ssh:// URL of an absolute server-side path."""
        p = Path(path)
        if not p.is_absolute():
            raise ValueError(f"server-side path must be absolute: {p}")
        return f"ssh://{self.host}:{self.port}{p.as_posix()}"

    def local_path(self, url: str) -> Path:
        """The server-side (= local) directory behind an ssh:// URL of this server."""
        return Path(urlsplit(url).path)

    def new_dir(self, name: str = "remote") -> str:
        """Make a fresh, empty directory on the server side and return its URL."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60]
        return self.url_for(tempfile.mkdtemp(prefix=f"{safe}-", dir=self.root))

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: os.environ) with HOME = `home`: DVC sees no user ssh config
        and, should dvc-ssh check host keys, finds this server's key in known_hosts."""
        env = dict(os.environ if base is None else base)
        env["HOME"] = str(self.home)
        return env

    def configure_dvc(self, repo_path: Path, remote_name: str, url: str | None = None) -> None:
        """Make ``remote_name`` (at ``url``, default `url`) the default remote of the DVC
        repo at ``repo_path``, with user and port in .dvc/config and the key file in
        .dvc/config.local, so `dvc push`/`pull` run without any prompt (the key has no
        passphrase; dvc-ssh does not check host keys, see the module docstring). A port in
        ``url`` wins; otherwise this server's port is configured."""
        from dvc.config import Config

        # What `dvc remote add -f -d` and `dvc remote modify [--local]` write, through the
        # Config.edit they use, in this process: a `python -m dvc` costs half a CPU-second.
        url = self.url if url is None else url
        config = Config(dvc_dir=str(repo_path / ".dvc"))
        with config.edit("repo") as conf:
            conf["remote"][remote_name] = {"url": url, "user": self.user}
            if urlsplit(url).port is None:
                conf["remote"][remote_name]["port"] = str(self.port)
            conf["core"]["remote"] = remote_name
        with config.edit("local") as conf:
            conf["remote"].setdefault(remote_name, {})["keyfile"] = str(self.keyfile)


@dataclass
class SSHServer:
    """A running private sshd; `stop` ends it and anything it forked."""

    remote: SSHRemote
    process: subprocess.Popen[bytes]
    config: Path
    log: Path
    startup_seconds: float
    installed: bool = field(default=False)  # whether ensure-sshd.sh had to install it

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """End the server and the per-connection processes it forked.

        Those children are ended (and reaped by the listener) before the listener itself,
        so none is orphaned and left for PID 1 to reap (or, in a container whose PID 1
        does not reap, left as a zombie)."""
        if self.process.poll() is not None:
            return
        deadline = time.monotonic() + STOP_TIMEOUT
        # Give finished connections a moment to wind down by themselves, then ask the rest.
        while _descendants(self.process.pid) and time.monotonic() < deadline - 3:
            time.sleep(0.05)
        for pid in _descendants(self.process.pid):
            _terminate_sshd(pid)
        while _descendants(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        leftovers = _descendants(self.process.pid)
        self.process.terminate()
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT)
        # Anything that outlived all that (they call setsid(), so they are not in our
        # process group): end it by pid.
        for pid in leftovers:
            _terminate_sshd(pid)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the test process dies, even by SIGKILL
    (Linux prctl PR_SET_PDEATHSIG; elsewhere the fixture's teardown is all there is)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1


def _terminate_sshd(pid: int) -> None:
    """SIGTERM ``pid`` if it is still an sshd process (guards against pid reuse)."""
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
            os.kill(pid, signal.SIGTERM)


def _descendants(pid: int) -> list[int]:
    """Pids of all live descendants of ``pid`` (Linux /proc; empty elsewhere)."""
    parent: dict[int, int] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        parent[int(entry.name)] = int(fields[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found.extend(kids)
        frontier.extend(kids)
    return found


def find_sshd() -> Path | None:
    found = shutil.which("sshd", path=os.pathsep.join(["/usr/sbin", "/usr/local/sbin", "/sbin"]))
    found = found or shutil.which("sshd")
    return Path(found).resolve() if found else None


def ensure_sshd() -> tuple[Path, bool]:
    """The sshd binary, installing Debian's openssh-server if needed; (path, installed).

    ``KAUDIT_SSHD=/path/to/sshd`` picks a binary explicitly (never installs anything)."""
    explicit = os.environ.get("KAUDIT_SSHD")
    if explicit:
        if not (Path(explicit).is_absolute() and os.access(explicit, os.X_OK)):
            raise SSHDUnavailable(f"KAUDIT_SSHD={explicit} is not an executable absolute path")
        return Path(explicit), False
    sshd = find_sshd()
    if sshd is not None:
        return sshd, False
    if not ENSURE_SSHD.is_file():
        raise SSHDUnavailable(f"no sshd on this machine and {ENSURE_SSHD} is missing")
    try:
        proc = subprocess.run(
            ["bash", str(ENSURE_SSHD)],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=900,
        )
    except subprocess.TimeoutExpired:
        raise SSHDUnavailable(f"{ENSURE_SSHD.name} did not finish within 900 s") from None
    sshd = find_sshd()
    if proc.returncode != 0 or sshd is None:
        detail = (proc.stderr or proc.stdout).strip() or f"exit {proc.returncode}"
        raise SSHDUnavailable(f"no sshd and {ENSURE_SSHD.name} could not install it: {detail}")
    return sshd, True


def _keygen(path: Path, comment: str) -> None:
    try:
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            check=True,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise SSHDUnavailable("ssh-keygen is not on PATH (package openssh-client)") from None
    except subprocess.CalledProcessError as exc:
        raise SSHDUnavailable(f"ssh-keygen failed: {exc.stderr.strip()}") from None


def _q(path: Path) -> str:
    """A path as one sshd_config argument."""
    s = str(path)
    if '"' in s:
        raise SSHDUnavailable(f"cannot put a path with a double quote in sshd_config: {s}")
    return f'"{s}"'


def _write_config(base: Path, port: int, user: str) -> Path:
    config = base / "sshd_config"
    config.write_text(
        "\n".join(
            [
                "# private sshd for kronos-audit tests (tests/sshd.py)",
                f"Port {port}",
                f"ListenAddress {HOST}",
                f"HostKey {_q(base / 'ssh_host_ed25519_key')}",
                f"PidFile {_q(base / 'sshd.pid')}",
                f"AuthorizedKeysFile {_q(base / 'authorized_keys')}",
                f"AllowUsers {user}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "HostbasedAuthentication no",
                "PermitRootLogin prohibit-password",
                "PermitEmptyPasswords no",
                "UsePAM no",
                "StrictModes no",  # the temp dir lives under world-writable /tmp
                "UseDNS no",
                "PrintMotd no",
                "X11Forwarding no",
                "AllowTcpForwarding no",
                "AllowAgentForwarding no",
                "PermitTunnel no",
                "Subsystem sftp internal-sftp",
                "LogLevel INFO",
                "",
            ]
        )
    )
    config.chmod(0o600)
    return config


def _wait_ready(proc: subprocess.Popen[bytes], port: int, deadline: float) -> str | None:
    """None once the port answers with an SSH banner; else why not (process exited/timeout)."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"sshd exited with status {proc.returncode}"
        try:
            with socket.create_connection((HOST, port), timeout=1.0) as s:
                s.settimeout(2.0)
                if s.recv(64).startswith(b"SSH-"):
                    return None
        except OSError:
            pass
        time.sleep(0.05)
    return f"sshd did not accept connections on {HOST}:{port} within {START_TIMEOUT:.0f}s"


def start_sshd(base: Path, *, attempts: int = 3) -> SSHServer:
    """Start a private sshd with its files in the (empty, existing) directory ``base``.

    Raises `SSHDUnavailable` with the reason (and sshd's own log) when it cannot.
    """
    t0 = time.monotonic()
    sshd, installed = ensure_sshd()
    user = pwd.getpwuid(os.getuid()).pw_name
    base = base.resolve()

    host_key = base / "ssh_host_ed25519_key"
    client_key = base / "id_ed25519"
    _keygen(host_key, "kaudit-test-host")
    _keygen(client_key, f"kaudit-test-client-{user}")
    authorized = base / "authorized_keys"
    shutil.copyfile(client_key.with_name(client_key.name + ".pub"), authorized)
    authorized.chmod(0o600)
    key_type, key_b64 = host_key.with_name(host_key.name + ".pub").read_text().split()[:2]

    root = base / "remotes"
    root.mkdir()
    home = base / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh").chmod(0o700)

    if os.geteuid() == 0:
        # sshd run by root insists on its privilege-separation directory, normally made by
        # the service's start-up (tmpfs /run), which we never run.
        with contextlib.suppress(OSError):
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)

    log = base / "sshd.log"
    failure = "not started"
    for _ in range(attempts):
        port = unused_port()
        config = _write_config(base, port, user)
        # sshd -t: a configuration problem gets a clear message instead of a silent exit.
        check = subprocess.run(
            [str(sshd), "-t", "-f", str(config)],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        if check.returncode != 0:
            raise SSHDUnavailable(f"{sshd} -t rejected the test config: {check.stderr.strip()}")
        with log.open("ab") as log_fh:
            proc = subprocess.Popen(
                [str(sshd), "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log_fh,
                stderr=log_fh,
                start_new_session=True,  # a Ctrl-C in the terminal is pytest's, not sshd's
                preexec_fn=_die_with_parent,
            )
        why = _wait_ready(proc, port, time.monotonic() + START_TIMEOUT)
        if why is None:
            known_hosts = home / ".ssh" / "known_hosts"
            known_hosts.write_text(f"[{HOST}]:{port} {key_type} {key_b64}\n")
            remote = SSHRemote(
                url=f"ssh://{HOST}:{port}{root.as_posix()}",
                host=HOST,
                port=port,
                user=user,
                keyfile=client_key,
                known_hosts=known_hosts,
                home=home,
                root=root,
            )
            return SSHServer(
                remote=remote,
                process=proc,
                config=config,
                log=log,
                startup_seconds=time.monotonic() - t0,
                installed=installed,
            )
        if proc.poll() is None:
            proc.kill()
            proc.wait(STOP_TIMEOUT)
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
        failure = f"{why}; sshd log:\n{tail}" if tail else why
        if "Address already in use" not in tail:
            break  # only a lost port race is worth another try
    raise SSHDUnavailable(failure)
