"""A real single-node Slurm cluster for the tests that need one (scripts/slurm.sh): started
once per session, only when such a test runs, and stopped afterwards if this session
started it.

There is one cluster per machine (its ports, its directory under /tmp), and under
pytest-xdist each worker sets the fixture up for itself: the workers of one session count
themselves in a file they share, so that the cluster is stopped by the last one to leave,
never while another worker's jobs still run on it."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm.sh"


def _can_be_root() -> bool:
    if os.geteuid() == 0:
        return True
    if shutil.which("sudo") is None:
        return False
    return subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0


@contextmanager
def _session_lock(shared: Path) -> Iterator[None]:
    """Held by one worker of this session at a time."""
    with (shared / "slurm.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _count(shared: Path, change: int) -> int:
    """Add ``change`` to the number of this session's workers using the cluster."""
    users = shared / "slurm.users"
    now = (int(users.read_text()) if users.exists() else 0) + change
    users.write_text(str(now))
    return now


@pytest.fixture(scope="session")
def slurm_conf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The cluster's slurm.conf (for ``SLURM_CONF``), the cluster up and its node idle."""
    if not _can_be_root():
        # slurmd runs jobs as their user, so it must be root; so must apt-get.
        pytest.skip("a Slurm cluster needs root or passwordless sudo (scripts/slurm.sh)")
    if not Path("/usr/sbin/slurmctld").exists() and shutil.which("apt-get") is None:
        pytest.skip("Slurm is not installed and there is no apt-get to install it")
    # What this session's workers share: the parent of a worker's own base temp directory
    # (pytest-xdist), or this process's own when there are no workers.
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with _session_lock(shared):
        started = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True)
        if started.returncode != 0:
            pytest.fail(f"scripts/slurm.sh start failed: {started.stderr.strip()}", pytrace=False)
        lines = started.stdout.splitlines()
        if "started" in lines:  # this session started it: it stops it when done
            (shared / "slurm.started").touch()
        _count(shared, +1)
    (conf,) = [line.removeprefix("SLURM_CONF=") for line in lines if line.startswith("SLURM_CONF=")]
    yield Path(conf)
    with _session_lock(shared):
        if _count(shared, -1) == 0 and (shared / "slurm.started").exists():
            (shared / "slurm.started").unlink()  # leave nothing running
            subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, check=False)
