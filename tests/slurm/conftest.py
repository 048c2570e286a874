"""A real single-node Slurm cluster for the tests that need one (scripts/slurm.sh): started
once per session, only when such a test runs, and stopped afterwards if this session
started it."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
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


@pytest.fixture(scope="session")
def slurm_conf() -> Iterator[Path]:
    """The cluster's slurm.conf (for ``SLURM_CONF``), the cluster up and its node idle."""
    if not _can_be_root():
        # slurmd runs jobs as their user, so it must be root; so must apt-get.
        pytest.skip("a Slurm cluster needs root or passwordless sudo (scripts/slurm.sh)")
    if not Path("/usr/sbin/slurmctld").exists() and shutil.which("apt-get") is None:
        pytest.skip("Slurm is not installed and there is no apt-get to install it")
    started = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True)
    if started.returncode != 0:
        pytest.fail(f"scripts/slurm.sh start failed: {started.stderr.strip()}", pytrace=False)
    lines = started.stdout.splitlines()
    (conf,) = [line.removeprefix("SLURM_CONF=") for line in lines if line.startswith("SLURM_CONF=")]
    yield Path(conf)
    if "started" in lines:  # this session started it: leave nothing running
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, check=False)
