"""Helpers the framework tests import: the training examples committed in a real kaudit
project, run plainly, under `kaudit run`, and killed for real."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import pytest

from kronos_audit.keys.home import generate_key
from kronos_audit.storage.setup import init_project
from tests.helpers import git, recorded_once
from tests.runtime.test_faults import HANG_GUARD, last_json, newest_step

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def commit_example(repo: Path, example: str) -> Path:
    """``examples/<example>/run.py`` as ``<repo>/<example>/run.py``, committed (a replay
    checks out the recorded commit); returns the directory it runs in."""
    where = repo / example
    where.mkdir()
    shutil.copy(EXAMPLES / example / "run.py", where / "run.py")
    git(repo, "add", example)
    git(repo, "commit", "-q", "-m", f"{example} example")
    return where


@contextmanager
def scratch_project(base: Path) -> Iterator[Path]:
    """A git repository with `kaudit init` done and a trusted key, in a key directory of
    its own: for a module-scoped reference run, which the per-test fixtures cannot serve."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KAUDIT_HOME", str(base / "home"))
        mp.delenv("KAUDIT_KEY", raising=False)
        for var in ("GIT_AUTHOR", "GIT_COMMITTER"):
            mp.setenv(f"{var}_NAME", "Test")
            mp.setenv(f"{var}_EMAIL", "test@example.com")
        mp.setenv("DVC_NO_ANALYTICS", "1")
        repo = base / "repo"
        repo.mkdir(parents=True)
        git(repo, "init", "-q", "-b", "main")
        proj, _ = init_project(repo)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "kaudit init")
        proj.trust_store().add(generate_key("reference").private_key.public_key(), "reference")
        yield repo


def run_plain(where: Path, *args: str) -> dict[str, Any]:
    """Run the example in ``where`` to the end, never interrupted; its last JSON line."""
    done = subprocess.run(
        [sys.executable, "run.py", *args], cwd=where, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return last_json(done.stdout)


def reference_result(base: Path, example: str, *args: str) -> dict[str, Any]:
    """An uninterrupted run's result, in a project of its own under ``base``."""
    with scratch_project(base) as repo:
        return run_plain(commit_example(repo, example), *args, "--run-id", "reference")


@dataclass(frozen=True)
class Reference:
    """An uninterrupted run of an example, recorded once for the session: its result, and a
    copy of its project (of the caller's own) holding its signed checkpoints."""

    example: str
    result: dict[str, Any]
    repo: Path
    """The kaudit project the example is committed in and ran in."""
    home: Path
    """The KAUDIT_HOME holding the key that signed the run (trusted by the project)."""

    @property
    def run_dir(self) -> Path:
        return self.repo / self.example / "checkpoints" / "reference"


def recorded_reference(factory: pytest.TempPathFactory, example: str, *args: str) -> Reference:
    """The example run once with ``args`` and ``--run-id reference``, never interrupted, in
    a project of its own (tests.helpers.recorded_once: one run whichever workers ask);
    each call gets its own copy of that project."""

    def record(into: Path) -> None:
        result = reference_result(into, example, *args)
        (into / "result.json").write_text(json.dumps(result))

    copy = recorded_once(f"{example}-reference", factory, record)
    result: dict[str, Any] = json.loads((copy / "result.json").read_text())
    return Reference(example, result, copy / "repo", copy / "home")


def finish(supervisor: subprocess.Popen[str]) -> tuple[str, str]:
    """Wait for `kaudit run` to end; its stdout and stderr."""
    try:
        return supervisor.communicate(timeout=HANG_GUARD)
    finally:
        supervisor.kill()


def wait_gently(predicate: Callable[[], bool], what: str, every: float = 0.02) -> None:
    """Until ``predicate()`` holds, asking every ``every`` seconds: for waits of seconds
    (a program importing torch, then training) where the moment it holds need not be met
    within a millisecond; a tighter loop takes the CPU the programs need. The deadline is
    a hang guard only."""
    deadline = time.monotonic() + HANG_GUARD
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(every)


def preempt_after_a_checkpoint(supervisor: subprocess.Popen[str], run_dir: Path) -> int:
    """Once the run has written a checkpoint, send `kaudit run` SIGTERM, as a scheduler
    preempting the job does (it forwards it to the program); the step it had reached."""
    # Any moment after the first checkpoint will do: the run has many steps left.
    wait_gently(lambda: newest_step(run_dir) > 0 or supervisor.poll() is not None, "a checkpoint")
    assert supervisor.poll() is None, "the run ended before it could be preempted"
    supervisor.send_signal(signal.SIGTERM)
    return newest_step(run_dir)


def datasets(checkpoint: Path) -> list[str]:
    """The paths of every dataset in an HDF5 file."""
    names: list[str] = []

    def visit(name: str, obj: object) -> None:
        if isinstance(obj, h5py.Dataset):
            names.append(f"/{name}")

    with h5py.File(checkpoint, "r") as f:
        f.visititems(visit)
    return names
