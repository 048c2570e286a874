"""Shared set-up for the benchmarks: a throw-away kaudit repository with a signing key (and
a DVC remote beside it, or the heat example in it), timing helpers, kaudit run in-process,
and the command line of an MPI launch."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from kronos_audit.keys.home import generate_key
from kronos_audit.project.repository import find_project
from kronos_audit.storage.remote import configure_remote
from kronos_audit.storage.setup import init_project

HEAT_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "heat" / "run.py"
"""The heat example's program: a real solver that checkpoints through ``ka.Run``."""
MPI_YIELD = "OMPI_MCA_mpi_yield_when_idle"  # Open MPI spells it so
"""Open MPI's setting that makes a rank waiting in MPI yield its core instead of spinning."""


def scratch_repo() -> Path:
    """An initialised, committed kaudit repository in a fresh temp dir, with a trusted key."""
    base = Path(tempfile.mkdtemp(prefix="kaudit-bench-"))
    os.environ["KAUDIT_HOME"] = str(base / "home")
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    repo = base / "repo"
    repo.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "bench@example.com",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "bench@example.com",
    }

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, env=env)

    git("init", "-q")
    (repo / "README").write_text("bench\n")
    project, _ = init_project(repo)
    git("add", "-A")
    git("commit", "-q", "-m", "bench")
    key = generate_key("bench")
    project.trust_store().add(key.private_key.public_key(), "bench")
    return repo


def heat_repo() -> Path:
    """A :func:`scratch_repo` with the heat example's program at ``heat/run.py`` (not yet
    committed: the caller adds what else it needs first)."""
    repo = scratch_repo()
    (repo / "heat").mkdir()
    shutil.copy(HEAT_EXAMPLE, repo / "heat" / "run.py")
    return repo


def kaudit_in_process(repo: Path, args: Sequence[str]) -> tuple[int, str]:
    """``kaudit ARGS`` run in this process from ``repo``, as the tests call it (click's
    runner): its exit code and output. No interpreter start is timed with it."""
    from click.testing import CliRunner

    from kronos_audit.cli import cli

    before = os.getcwd()
    os.chdir(repo)
    try:
        invoked = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    finally:
        os.chdir(before)
    return invoked.exit_code, invoked.output


def add_remote(repo: Path, remote: Path) -> None:
    """Make the local directory ``remote`` the DVC remote of the scratch repository
    ``repo``, committed, so that a run's git state is clean, as a real job's would be."""
    configure_remote(find_project(repo), str(remote))
    who = ["-c", "user.name=bench", "-c", "user.email=bench@example.com"]
    for args in (["add", "-A"], ["commit", "-q", "-m", "remote"]):
        subprocess.run(["git", *who, *args], cwd=repo, check=True, capture_output=True)


@contextmanager
def kaudit_home() -> Iterator[None]:
    """KAUDIT_HOME put back afterwards: :func:`scratch_repo` sets it for its key, and the
    caller (a test, say) may have its own."""
    before = os.environ.get("KAUDIT_HOME")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("KAUDIT_HOME", None)
        else:
            os.environ["KAUDIT_HOME"] = before


def mpiexec(ranks: int, *argv: str) -> list[str]:
    """The command line that starts ``argv`` on ``ranks`` MPI ranks: Open MPI's mpiexec
    beside this interpreter (the wheel's) or else on the PATH, oversubscribed (more ranks
    than cores is a case these benchmarks measure on a small machine)."""
    beside = Path(sys.executable).parent / "mpiexec"
    return [
        str(beside if beside.exists() else "mpiexec"),
        "--oversubscribe",
        "-n",
        str(ranks),
        *argv,
    ]


def mpi_env(**extra: str) -> dict[str, str]:
    """This process's environment for an mpiexec launch, with ``extra``: no DVC
    analytics, and Open MPI allowed to run as root."""
    return {
        **os.environ,
        "DVC_NO_ANALYTICS": "1",
        # Open MPI refuses root unless told twice (CI containers run as root).
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        **extra,
    }


def wall_times(n: int, fn: Callable[[], object]) -> list[float]:
    """Wall time of each of n runs of ``fn``."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def best_of(n: int, fn: Callable[[], object]) -> float:
    """Best wall time of n runs: the least disturbed by a noisy neighbour."""
    return min(wall_times(n, fn))


def median_of(n: int, fn: Callable[[], object]) -> float:
    """Median wall time of n runs: a typical cost, for fixed costs that vary little."""
    return statistics.median(wall_times(n, fn))


def run_fresh(script: str | Path, args: Sequence[str], what: str) -> str:
    """Standard output of ``script`` run with ``args`` in a fresh interpreter, so that no
    memory, page cache or imported module of this one carries over into a contender's
    figures. SystemExit naming ``what`` failed, with its standard error, if it does."""
    try:
        return subprocess.run(
            [sys.executable, str(Path(script).resolve()), *args],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "DVC_NO_ANALYTICS": "1", "JAX_PLATFORMS": "cpu"},
        ).stdout
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"the {what} contender failed:\n{e.stderr}") from None
