"""Shared set-up for the benchmarks: a throw-away kaudit repository with a signing key."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kronos_audit.keys.home import generate_key
from kronos_audit.storage.setup import init_project


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
