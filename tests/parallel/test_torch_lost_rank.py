"""A rank of a torch.distributed job that never joins, or that dies while the others wait in
a collective: the ranks left end on one line and exit 1, after the wait KAUDIT_TORCH_TIMEOUT
bounds, never hang (real gloo process groups, each rank a process of its own)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kronos_audit.errors import UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.parallel.torchdist import DEFAULT_TIMEOUT, TIMEOUT_ENV, timeout_seconds
from kronos_audit.project.repository import Project
from kronos_audit.runtime.uncaught import TRACEBACK_ENV
from tests.parallel.launch import free_port, launcher_env
from tests.runtime.test_faults import HANG_GUARD

pytestmark = pytest.mark.slow

PROGRAM = """\
import os
import sys

import kronos_audit as ka

with ka.Run("lost", root="checkpoints") as run:
    if run.rank == 1:
        os._exit(0)  # as a rank whose node died: no goodbye to the others
    run.comm.barrier()
"""


def ranks(root: Path, world: int, started: int, wait: str) -> list[subprocess.Popen[str]]:
    """``started`` ranks of a world of ``world`` running PROGRAM in ``root``, from the
    environment torchrun gives its workers, the ranks waiting ``wait`` seconds."""
    (root / "lost.py").write_text(PROGRAM)
    env = {
        **launcher_env(),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        TIMEOUT_ENV: wait,
    }
    env.pop(TRACEBACK_ENV, None)
    return [
        subprocess.Popen(
            [sys.executable, "lost.py"],
            cwd=root,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(started)
    ]


def ended(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """Exit status and stderr; the timeout only guards the suite against a hang."""
    try:
        _, err = proc.communicate(timeout=HANG_GUARD)
    finally:
        proc.kill()
    return proc.returncode, err


def test_a_rank_that_never_joins_ends_the_others_on_one_line(project: Project) -> None:
    (alone,) = ranks(project.root, 2, 1, "1")
    status, err = ended(alone)
    assert status == 1, err
    assert err.startswith(
        "kaudit: error: torch.distributed: not every rank joined the process group within 1 s ("
    ), err
    assert f"{TIMEOUT_ENV}=SECONDS waits longer" in err
    assert err.count("\n") == 1, err


def test_a_rank_that_dies_ends_the_one_waiting_in_a_collective_on_one_line(
    project: Project, key: SigningKey
) -> None:
    # A wait longer than the test takes: what ends the barrier is the dead peer's closed
    # connection, which gloo notices at once.
    survivor, dead = ranks(project.root, 2, 2, "600")
    assert ended(dead) == (0, "")
    status, err = ended(survivor)
    assert status == 1, err
    assert err.startswith(
        "kaudit: error: torch.distributed: barrier did not complete on every rank: "
    ), err
    assert err.count("\n") == 1, err


def test_the_wait_is_a_positive_number_of_seconds() -> None:
    assert timeout_seconds({}) == DEFAULT_TIMEOUT
    assert timeout_seconds({TIMEOUT_ENV: " 2.5 "}) == 2.5
    for bad in ("0", "-1", "soon", "nan", "inf"):
        with pytest.raises(UsageError, match=f"^{TIMEOUT_ENV}="):
            timeout_seconds({TIMEOUT_ENV: bad})
