"""A preemption signal on any rank brings every rank to the same checkpoint step."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kronos_audit.errors import UsageError
from kronos_audit.parallel import PreemptionVote, SingleProcess
from tests.parallel.launch import launcher_env, mpiexec, per_rank
from tests.runtime.test_faults import HANG_GUARD

# Each rank loops at its own pace (rank r sleeps r + 1 ms a step: the ranks drift apart),
# offering every step to the vote with its own PreemptionGuard's flag, and writes where it
# stopped. LAST bounds a broken vote: ranks that never agree stop there and disagree.
PROGRAM = """
import json
import os
import sys
import time
from pathlib import Path

from kronos_audit.parallel import PreemptionVote, detect
from kronos_audit.runtime.preemption import PreemptionGuard

LAST = 3000
comm = detect()
guard = PreemptionGuard()
guard.install()
vote = PreemptionVote(comm, deferred=sys.argv[1] == "deferred")
Path(f"pid.{comm.rank}.tmp").write_text(str(os.getpid()))
os.replace(f"pid.{comm.rank}.tmp", f"pid.{comm.rank}")
signalled_at = None
for step in range(1, LAST + 1):
    time.sleep(0.001 * (comm.rank + 1))
    requested = guard.requested  # read once: what this step's vote carries
    if requested and signalled_at is None:
        signalled_at = step
    if vote.poll(step, requested):
        break
vote.close()
comm.barrier()
out = {"rank": comm.rank, "agreed": vote.step, "last": step, "signalled_at": signalled_at,
       "signal": guard.received.name if guard.received else None}
Path(f"out.{comm.rank}.json").write_text(json.dumps(out))
"""

SIGNALLED = 1
"""The one rank whose process gets SIGUSR1 (not the launcher, which would forward it to all)."""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["blocking", "deferred"])
def test_a_signal_on_one_mpi_rank_stops_all_at_the_same_step(tmp_path: Path, mode: str) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM, encoding="utf-8")
    job = subprocess.Popen(
        mpiexec(3, "prog.py", mode),
        cwd=tmp_path,
        env=launcher_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + HANG_GUARD
        while not all((tmp_path / f"pid.{r}").exists() for r in range(3)):
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.05)
        time.sleep(0.2)  # let the ranks loop a while (and drift apart) first
        os.kill(int((tmp_path / f"pid.{SIGNALLED}").read_text()), signal.SIGUSR1)
        stdout, stderr = job.communicate(timeout=HANG_GUARD)
    finally:
        # ranks that never agree wait for each other for ever: end them (each rank is in
        # a process group of its own), then the launcher
        if job.poll() is None:
            for pid_file in tmp_path.glob("pid.*[0-9]"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)
            job.kill()
            job.communicate()
    assert job.returncode == 0, stdout + stderr
    docs = per_rank(tmp_path, 3)
    agreed = {doc["agreed"] for doc in docs}
    assert len(agreed) == 1, docs
    (step,) = agreed
    assert step is not None, docs
    assert all(doc["last"] == step for doc in docs), docs
    # only the signalled rank saw the signal, and the others followed it
    assert [doc["signal"] for doc in docs] == [None, "SIGUSR1", None]
    seen = docs[SIGNALLED]["signalled_at"]
    # blocking: the step whose vote carried the request; deferred: the step after it
    assert step == seen + (1 if mode == "deferred" else 0), docs


def test_a_blocking_vote_stops_at_the_request_and_stays_stopped() -> None:
    vote = PreemptionVote(SingleProcess())
    assert vote.deferred is False
    assert [vote.poll(s, False) for s in (1, 2)] == [False, False]
    assert not vote.agreed
    assert vote.poll(3, True) is True
    assert vote.step == 3
    assert vote.poll(4, False) is True
    assert vote.step == 3


def test_a_deferred_vote_stops_one_call_after_the_request() -> None:
    with PreemptionVote(SingleProcess(), deferred=True) as vote:
        assert vote.poll(1, False) is False
        assert vote.poll(2, True) is False  # travelling
        assert vote.poll(3, False) is True  # a request is kept: once asked, always asked
        assert vote.step == 3


def test_a_deferred_vote_is_torch_distributeds_default() -> None:
    class Named(SingleProcess):
        name = "torch.distributed"

    assert PreemptionVote(Named()).deferred is True
    assert PreemptionVote(Named(), deferred=False).deferred is False


def test_a_step_that_is_not_an_integer_is_refused() -> None:
    with pytest.raises(UsageError, match="step must be an integer, not float"):
        PreemptionVote(SingleProcess()).poll(1.5, False)  # type: ignore[arg-type]
