"""Helpers the tests import (``from tests.helpers import ...``): the installed kaudit, git,
HDF5 checkpoints, keys no one trusts and keys made on an attacker's machine, the click app
in-process, and the bad-input check.
The fixtures that use them live in tests/conftest.py."""

from __future__ import annotations

import fcntl
import os
import pty
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner, Result

from kronos_audit.cli import cli
from kronos_audit.keys.home import generate_key, user_trust_dir
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.storage.fetch import FetchItem
from kronos_audit.storage.remote import Storage

KAUDIT = [sys.executable, "-c", "from kronos_audit.cli import main; main()"]
"""The installed `kaudit`, as a subprocess of this interpreter."""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


def untrusted_key(name: str) -> SigningKey:
    """A key the user holds that no trust store holds: ``generate_key`` anchors a new key
    in the user's own trust store, so it is taken out again."""
    k = generate_key(name)
    (user_trust_dir() / f"{name}.pub").unlink()
    return k


@contextmanager
def elsewhere(home: Path) -> Iterator[None]:
    """Within the block, ``home`` is KAUDIT_HOME: what is done there (keys made, checkpoints
    signed) is done on another person's machine, with their own key directory and trust
    store. The test's own KAUDIT_HOME is back afterwards."""
    saved = os.environ.get("KAUDIT_HOME")
    os.environ["KAUDIT_HOME"] = str(home)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["KAUDIT_HOME"]
        else:
            os.environ["KAUDIT_HOME"] = saved


def attacker_key(name: str, home: Path) -> SigningKey:
    """An attacker's key, made on the attacker's machine (``home`` as KAUDIT_HOME): neither
    the user's key directory nor their trust store holds it."""
    with elsewhere(home):
        return generate_key(name)


def write_checkpoint(path: Path, seed: int = 0, *, n: int = 64) -> Path:
    """A small but varied HDF5 checkpoint: groups, scalars, chunked + compressed, strings."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f["fields/u"] = rng.standard_normal((n, n))
        f["fields/v"] = rng.standard_normal((n, n)).astype(np.float32)
        f.create_dataset(
            "weights", data=rng.integers(0, 1000, (n, 8)), chunks=(8, 8), compression="gzip"
        )
        f["step"] = np.int64(seed)
        f["labels"] = np.array(["alpha", "beta"], dtype=h5py.string_dtype())
        f.attrs["note"] = "test checkpoint"
    return path


def run_cli(*args: str, cwd: Path | None = None) -> Result:
    """Invoke the click app in-process (optionally from ``cwd``), like the installed kaudit."""
    runner = CliRunner()
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return runner.invoke(cli, list(args), catch_exceptions=False)
    finally:
        os.chdir(old)


def on_terminal(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """What the installed ``kaudit ARGS`` writes to stdout when it is a (pseudo-)terminal
    (TERM=xterm-256color and ``env`` over this environment); it must exit 0."""
    primary, secondary = pty.openpty()
    with subprocess.Popen(
        [*KAUDIT, *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=subprocess.PIPE,
        env={**os.environ, "TERM": "xterm-256color", **(env or {})},
    ) as proc:
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the other end closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(primary)
        assert proc.wait(timeout=60) == 0, proc.stderr
    return b"".join(chunks).decode()


def assert_bad_input(result: Result, *mentions: str, no_stdout: bool = False) -> str:
    """Exit 2 with exactly one `kaudit: error:` line on stderr mentioning each of
    ``mentions``, and no traceback; returns the line."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert line.startswith("kaudit: error: ")
    for m in mentions:
        assert m in line, line
    assert "Traceback" not in result.output
    if no_stdout:
        assert result.stdout == ""
    return line


def signed_items(checkpoints: list[Path]) -> list[FetchItem]:
    """What `Storage.push` takes for each checkpoint: the md5, sha256 and size its
    manifest (beside it) signs. The manifests are ones the test wrote: not verified here."""
    from kronos_audit.checkpoint.layout import manifest_path_for
    from kronos_audit.statement.manifest import read_manifest

    items = []
    for c in checkpoints:
        m = read_manifest(manifest_path_for(c))
        assert m.subject_md5 is not None
        items.append(FetchItem(c, m.subject_md5, m.subject_sha256, m.record.size))
    return items


def discard(storage: Storage, checkpoint: Path) -> None:
    """`Storage.discard` of a checkpoint by what its manifest (beside it, the test's own)
    signs: gone from the work tree and DVC's cache."""
    (item,) = signed_items([checkpoint])
    storage.discard(item)


def recorded_once(
    name: str, factory: pytest.TempPathFactory, record: Callable[[Path], None]
) -> Path:
    """A copy, in a directory of the caller's own, of what ``record(directory)`` made: made
    once for the whole test session however many xdist workers ask (the first under a
    lock, the others waiting for it), so that a recorded run costs one recording, not one
    per worker that runs a test of the module. Tests never share its files, only its
    cost."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    shared = factory.getbasetemp().parent if run else factory.getbasetemp()
    made = shared / f"recorded-{name}-{run or 'session'}"
    with (shared / f"recorded-{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (made / ".complete").exists():
                shutil.rmtree(made, ignore_errors=True)
                made.mkdir()
                record(made)
                (made / ".complete").touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    copy = factory.mktemp(f"recorded-{name}")
    shutil.copytree(made, copy, symlinks=True, dirs_exist_ok=True)
    return copy


def recorded_project(
    name: str,
    factory: pytest.TempPathFactory,
    templates: tuple[Path, Path],
    record: Callable[[Path], None],
    into: Path,
    mp: pytest.MonkeyPatch,
) -> Path:
    """A kaudit project in which ``record(root)`` ran, made once for the whole test session
    (:func:`recorded_once` under ``name``) and moved to ``into`` (returned), the test's own
    copy to change as it likes.

    The project is what the ``project`` and ``key`` fixtures make: the session's template
    (``repo_templates``) with a key "tester" of the user's trusted by it, ``record``
    running in the tests' environment with that key the user's only one. ``mp`` sets
    KAUDIT_HOME to a copy of that key directory: the test is the user who recorded the
    run, and ``select_key("tester")`` is the key that signed it."""
    from kronos_audit.project.repository import find_project
    from tests.conftest import isolate

    def make(made: Path) -> None:
        with pytest.MonkeyPatch.context() as m:
            home = isolate(m, factory.mktemp)
            root = factory.mktemp(f"{name}-recording") / "repo"
            shutil.copytree(templates[1], root, symlinks=True)
            k = generate_key("tester")
            find_project(root).trust_store().add(k.private_key.public_key(), "tester")
            record(root)
        shutil.move(root, made / "repo")
        shutil.move(home, made / "home")

    copy = recorded_once(name, factory, make)
    shutil.move(copy / "repo", into)
    mp.setenv("KAUDIT_HOME", str(copy / "home"))
    return into


def replay_repository(
    factory: pytest.TempPathFactory,
    templates: tuple[Path, Path],
    into: Path,
    mp: pytest.MonkeyPatch,
    *,
    heat: bool = False,
    attested: bool = False,
    then: tuple[str, Callable[[Path], object]] | None = None,
) -> Path:
    """tests/replay/conftest.py's ``repo`` (the examples and the test programs committed in
    a kaudit project) as :func:`recorded_project` makes one, at ``into``: with ``heat``,
    that module's ``heat`` run recorded in it too (30 steps, a checkpoint every 10, at
    heat/checkpoints/heat); with ``attested``, step 20 of that run also replayed with
    ``--attest`` (tests/report/conftest.py's ``attested``); with ``then`` (a name and a
    function), the function run on the repository's root after those, in the same
    environment. Each is recorded once for the whole session, whichever module asks: the
    replay, gate and report tests share them."""
    import tempfile

    from tests.replay import conftest as replay
    from tests.replay.helpers import commit_all, manifest
    from tests.replay.helpers import record as run_program

    def record(root: Path) -> None:
        with pytest.MonkeyPatch.context() as m:  # the environment of replay_tmp
            m.setattr(tempfile, "tempdir", str(factory.mktemp("replay-work")))
            m.setenv("PYTHON", sys.executable)
            for var in ("KAUDIT_TEST_ORDER", "KAUDIT_RESUME_FROM", "KAUDIT_STOP_AT"):
                m.delenv(var, raising=False)
            for var in ("KAUDIT_OUT", "KAUDIT_SEED"):
                m.delenv(var, raising=False)
            for name in ("heat", "montecarlo", "train"):
                (root / name).mkdir()
                shutil.copy(replay.EXAMPLES / name / "run.py", root / name / "run.py")
            programs = root / "programs"
            programs.mkdir()
            (programs / "noisy.py").write_text(replay.NOISY)
            (programs / "order.py").write_text(replay.ORDER)
            (programs / "seedless.py").write_text(replay.SEEDLESS)
            (programs / "solver.sh").write_text(replay.SOLVER_SH)
            (programs / "solve").write_text(replay.SOLVE_ANY_NAME)
            (programs / "solve").chmod(0o755)
            commit_all(root, "programs")
            if heat or attested:
                run_program(root, "heat", "run.py", "--steps", "30", "--every", "10", "--n", "32")
            if attested:
                run_dir = root / "heat" / "checkpoints" / "heat"
                result = run_cli("replay", str(manifest(run_dir, 20)), "--attest")
                assert result.exit_code == 0, result.output
                assert (run_dir / "step-00000020.h5.replay.json").is_file()
            if then is not None:
                then[1](root)

    name = "replay-programs" + ("-heat" if heat or attested else "") + ("-attested" * attested)
    if then is not None:
        name += f"-{then[0]}"
    return recorded_project(name, factory, templates, record, into, mp)


def pushed_and_cloned(project_root: Path, tmp_path: Path, what: str) -> Path:
    """Push ``what`` (a path under ``project_root``, its DVC remote configured) with
    ``kaudit push``, commit everything, and clone the repository into ``tmp_path/clone``:
    the clone, where only git's files are and the data is in the remote."""
    pushed = run_cli("push", what, cwd=project_root)
    assert pushed.exit_code == 0, pushed.output
    git(project_root, "add", "-A")
    git(project_root, "commit", "-q", "-m", "trained")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project_root), str(clone))
    return clone
