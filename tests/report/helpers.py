"""Helpers the report tests import: chains signed fast, as bench/bench_manifest.py builds
one, at the wall-clock times a test chooses (a long one with a restart and a pause in its
timeline among them)."""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Sequence
from pathlib import Path

from kronos_audit.checkpoint.hashing import digest_file
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.provenance.gitstate import git_state
from kronos_audit.signing.predicate import RunRecord
from kronos_audit.signing.sign import sign_checkpoint
from kronos_audit.statement.manifest import Manifest
from tests.helpers import write_checkpoint

START = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def long_chain(project: Project, key: SigningKey, n: int, run: str = "long") -> Path:
    """``n`` checkpoints of one tiny file, a minute apart in their signed creation time,
    restarted once (a third of the way) and paused for a day (two thirds of the way)."""
    return timed_chain(
        project,
        key,
        [60.0 * step + 86400.0 * (step > 2 * n // 3) for step in range(1, n + 1)],
        run,
        restart_at=n // 3 + 1,
    )


def timed_chain(
    project: Project,
    key: SigningKey,
    seconds: Sequence[float],
    run: str,
    *,
    restart_at: int | None = None,
) -> Path:
    """A run of one tiny file checkpointed at steps 1, 2, ..., the i-th signed ``seconds[i]``
    after :data:`START`, restarted before step ``restart_at`` when given; its directory."""
    directory = project.root / "checkpoints" / run
    directory.mkdir(parents=True)
    tiny = write_checkpoint(project.root / f"tiny-{run}.h5", n=16)
    digests = digest_file(tiny, md5=True)
    git = git_state(project.root)
    parent: Manifest | None = None
    for step, at in enumerate(seconds, 1):
        path = directory / f"step-{step:08d}.h5"
        shutil.copyfile(tiny, path)
        restarted = restart_at is not None and step >= restart_at
        when = START + dt.timedelta(seconds=at)
        parent = sign_checkpoint(
            path,
            digests,
            project=project,
            key=key,
            run=run,
            step=step,
            parent=parent,
            git=git,
            record=RunRecord(restart_count=int(restarted)),
            created=when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        )
    tiny.unlink()
    return directory
