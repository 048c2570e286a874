"""scripts/slurm.sh: the cluster it starts is this host, and starting it again is a no-op."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm.sh"


def slurm(conf: Path, *args: str) -> str:
    return subprocess.run(
        list(args),
        env={**os.environ, "SLURM_CONF": str(conf)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def slurmd_cpus() -> int:
    """This host's CPUs as slurmd counts them (``slurmd -C``: the CPUs its cgroup allows,
    which a container may hold to fewer than the machine has)."""
    node = subprocess.run(
        ["/usr/sbin/slurmd", "-C"], capture_output=True, text=True, check=True
    ).stdout.split()
    (cpus,) = [field.removeprefix("CPUs=") for field in node if field.startswith("CPUs=")]
    return int(cpus)


def test_the_partition_is_this_host_with_its_cpus_and_memory(slurm_conf: Path) -> None:
    shown = slurm(slurm_conf, "sinfo", "--noheader", "--Node", "--format=%P %c %m %T")
    (line,) = shown.splitlines()  # one node
    partition, cpus, memory, state = line.split()
    assert partition == "debug*"  # the default partition
    # whatever the host's core count, and however it is counted: slurmd's own count, which
    # is at most the machine's (os.cpu_count() counts CPUs a cgroup may keep from slurmd)
    assert int(cpus) == slurmd_cpus()
    assert 1 <= int(cpus) <= (os.cpu_count() or 1)
    mem_total_kib = next(
        int(row.split()[1])
        for row in Path("/proc/meminfo").read_text().splitlines()
        if row.startswith("MemTotal:")
    )
    assert int(memory) == mem_total_kib // 1024
    assert state in {"idle", "mixed", "allocated"}


def test_starting_it_again_finds_it_running(slurm_conf: Path) -> None:
    again = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == ["running", f"SLURM_CONF={slurm_conf}"]
    status = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True)
    assert status.returncode == 0, status.stderr


def test_an_unknown_subcommand_is_a_usage_error() -> None:
    done = subprocess.run(["bash", str(SCRIPT), "restart"], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == "usage: bash scripts/slurm.sh start|stop|status\n"
