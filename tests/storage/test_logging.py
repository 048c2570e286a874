"""DVC's chatter is held back on DVC's own loggers only: a program's own log lines all
arrive while kaudit drives DVC (``dvc init``, background pushes), and DVC's INFO lines
reach neither the program's handlers nor its console."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kronos_audit.storage._dvc import DVC_LOGGERS, quiet_dvc

# A user's program: its own logging set up first, then `kaudit init` and a remote, then a
# run that checkpoints every step and pushes in the background while the program logs.
PROGRAM = """
import json, logging, sys, threading, time

import numpy as np

import kronos_audit as ka
from kronos_audit.storage.setup import init_project
from kronos_audit.keys.home import generate_key
from kronos_audit.storage import configure_remote
from kronos_audit.storage.remote import Storage

STEPS, PER_STEP = 20, 100

pushing = threading.Event()
pushes = []
push = Storage.push


def timed_push(self, *args, **kwargs):
    # Instrumentation only: tells which of the program's lines were logged during a push.
    pushing.set()
    try:
        pushes.append(push(self, *args, **kwargs))
        return pushes[-1]
    finally:
        pushing.clear()


Storage.push = timed_push


class Counter(logging.Handler):
    def __init__(self):
        super().__init__()
        self.count = 0
        self.during_push = 0

    def emit(self, record):
        self.count += 1
        self.during_push += pushing.is_set()


logging.basicConfig(
    level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s"
)


class Seen(logging.Handler):
    def __init__(self):
        super().__init__()
        self.names = set()

    def emit(self, record):
        self.names.add(record.name)


seen = Seen()
logging.getLogger().addHandler(seen)
counter = Counter()
log = logging.getLogger("solver")
log.addHandler(counter)

project, created = init_project(".")
configure_remote(project, sys.argv[1])
key = generate_key("solver")
with ka.Run("heat", seed=1, every=ka.EverySteps(1), key=key, push=True) as run:
    state = {"u": np.zeros((128, 128))}
    for step in run.steps(STEPS):
        state = {"u": state["u"] + 1.0}
        run.checkpoint(step, state)  # written, signed and pushed on the background thread
        for i in range(PER_STEP):
            log.info("step %d line %d", step, i)
            time.sleep(0.001)
print(json.dumps({
    "created": created,
    "counted": counter.count,
    "during_push": counter.during_push,
    "pushes": len(pushes),
    "uploaded": sum(pushes),
    "push_failures": run.push_failures,
    "other_loggers": sorted(seen.names - {"solver"}),
}))
"""


@pytest.mark.slow
def test_a_programs_lines_all_arrive_while_pushes_run_and_dvc_stays_quiet(
    git_repo: Path, tmp_path: Path
) -> None:
    remote = tmp_path / "remote"
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    done = subprocess.run(
        [sys.executable, str(script), str(remote)],
        cwd=git_repo,
        capture_output=True,
        text=True,
        env={**os.environ, "DVC_NO_ANALYTICS": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    *before, last = done.stdout.splitlines()
    report = json.loads(last)
    assert report["created"]  # `dvc init` ran in this process, with its INFO greeting
    assert report["pushes"] == 20
    assert report["uploaded"] == 20
    assert report["push_failures"] == []
    assert len(list(remote.rglob("*"))) > 20  # the objects are in the remote
    # Lines were logged while pushes ran (or the test could not tell the bug), and none
    # of the 2,000 was lost: not at the program's handler, not on its console.
    assert report["during_push"] >= 50, report
    assert report["counted"] == 2000, report
    console = done.stderr.splitlines()
    assert len([line for line in console if line.startswith("solver INFO step ")]) == 2000
    # DVC's INFO chatter reached neither the program's root handlers nor its console
    # (DVC's own handlers write to stdout; the root handler to stderr).
    assert report["other_loggers"] == [], report
    assert before == [], before
    assert not [line for line in console if not line.startswith("solver INFO step ")], console
    assert "Initialized DVC repository" not in done.stdout + done.stderr


def test_quiet_dvc_holds_back_dvc_info_and_no_other_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    user = logging.getLogger("solver")
    with quiet_dvc():
        logging.getLogger("dvc.repo.init").info("Initialized DVC repository.")
        logging.getLogger("dvc_data.index").info("dvc-data chatter")
        logging.getLogger("asyncssh").info("Opening SSH connection")
        logging.getLogger("dvc.repo.push").warning("a warning still passes")
        user.info("the program's own line")
        logging.getLogger("kronos_audit.storage").info("kaudit's own line")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("dvc.repo.push", "WARNING", "a warning still passes"),
        ("solver", "INFO", "the program's own line"),
        ("kronos_audit.storage", "INFO", "kaudit's own line"),
    ]


def test_quiet_dvc_puts_the_levels_back_after_the_last_of_overlapping_blocks() -> None:
    import dvc  # noqa: F401  (configures DVC's loggers, as any use of DVC does)

    before = {name: logging.getLogger(name).level for name in DVC_LOGGERS}
    dvc_logger = logging.getLogger("dvc")
    assert before["dvc"] == logging.INFO
    entered, release = threading.Event(), threading.Event()

    def background() -> None:
        with quiet_dvc():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=background)
    thread.start()
    assert entered.wait(10)
    with quiet_dvc():
        assert not dvc_logger.isEnabledFor(logging.INFO)
    # The other block is still running: DVC stays quiet.
    assert not dvc_logger.isEnabledFor(logging.INFO)
    release.set()
    thread.join(10)
    assert {name: logging.getLogger(name).level for name in DVC_LOGGERS} == before
    assert dvc_logger.isEnabledFor(logging.INFO)  # DVC's own setting (INFO) is back


def test_quiet_dvc_leaves_a_logger_the_user_set_quieter_as_it_is() -> None:
    import dvc  # noqa: F401

    fsspec = logging.getLogger("fsspec")
    previous = fsspec.level
    fsspec.setLevel(logging.ERROR)
    try:
        with quiet_dvc():
            assert fsspec.level == logging.ERROR
        assert fsspec.level == logging.ERROR
    finally:
        fsspec.setLevel(previous)
