"""A commit killed with SIGKILL before and after every rename, link and mkdir it makes.

The program below commits step 1, then arms a Python audit hook (``sys.addaudithook``: the
events ``os.rename`` (``os.replace`` too), ``os.link``, ``os.symlink`` and ``os.mkdir``
that CPython raises before each call) and commits step 2; the hook kills its own process
with SIGKILL just before the armed event numbered ``kill_at`` happens, or, when there is
no such event (``AFTER``), once the commit has returned. A first run records every event
(nothing killed); then one run is killed before each kind of event at its first and last
occurrence (the same code made for the next file is the same kill) and before every event
of a kind of its own. On one process (a checkpoint
file), on two ranks that are threads of one process (a sharded step: each rank's shard,
rank 0's index, tree and manifest; the kill takes every rank), and on two MPI processes
under mpiexec (rank 0's events, rank 0 killed: mpiexec then ends the other wherever it
is).

After each kill, step 2 is either absent (no manifest: never valid, redone by the next
run) or fully tracked: every object its manifest signs (and the index's tree) is in DVC's
cache as the signed bytes, its ``.dvc`` file names them, and ``kaudit push`` of the run
sends the step as it is, with nothing to repair. And a sharded step whose manifest cannot
be written leaves nothing tracked.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.layout import INDEX_NAME, TREE_NAME
from kronos_audit.errors import CheckpointError, ManifestError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.runtime.steps import shards as sharded
from kronos_audit.statement.manifest import Manifest, read_manifest
from kronos_audit.storage.fetch import FetchItem, local_mismatch
from kronos_audit.storage.remote import configure_remote
from kronos_audit.storage.steps import step_items
from kronos_audit.storage.tracking import cache_object_path, dvc_file_for, read_dvc_file
from tests.helpers import git, run_cli
from tests.parallel.launch import launcher_env, mpiexec
from tests.threadranks import ThreadRanks, on_ranks, thread_run

pytestmark = pytest.mark.slow

HANG_GUARD = 300.0  # seconds; only stops a broken test from hanging CI, never a timing claim
RUN = "kp"
TESTS_ROOT = Path(__file__).resolve().parents[2]
AFTER = 1_000_000
"""``kill_at`` for a kill once the commit has returned: past any event it makes."""
SHARDS_DVC = ["rank-000000-of-000002.h5.dvc", "rank-000001-of-000002.h5.dvc"]

PROGRAM = """
import os, signal, sys, threading
from pathlib import Path
import numpy as np
import kronos_audit as ka

mode, kill_at, log_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
root = os.path.realpath(os.getcwd())
log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
armed = False
count = 0
guard = threading.Lock()
EVENTS = {"os.rename": 1, "os.link": 1, "os.symlink": 1, "os.mkdir": 0}


def kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def hook(event, args):
    global count
    if not armed or event not in EVENTS:
        return
    target = os.path.realpath(os.fsdecode(args[EVENTS[event]]))
    if not target.startswith(root + os.sep) or os.sep + ".git" + os.sep in target:
        return
    with guard:
        if count == kill_at:
            kill()  # before this event: the ones counted so far are done, no more
        os.write(log, f"{event} {os.path.relpath(target, root)}\\n".encode())
        count += 1


sys.addaudithook(hook)


def state(rank):
    return {"u": np.arange(64.0).reshape(8, 8) + rank}


def steps(run, rank):
    global armed
    run.restore()
    run.checkpoint(1, state(rank), **layout)
    if rank == 0:
        armed = True  # before step 2's commit: every rank meets rank 0 in it
    run.checkpoint(2, state(rank + 10), **layout)
    if rank == 0:
        armed = False
        if kill_at >= count:
            kill()  # once the commit has returned: AFTER, or past its last event


layout = {} if mode == "file" else {"layout": {"u": ka.Block(axis=0)}}
if mode == "threads":
    from tests.threadranks import on_ranks, thread_run

    def program(comm):
        with thread_run(Path.cwd(), "kp", comm) as run:
            steps(run, comm.rank)

    on_ranks(2, program)
else:  # one process, or each rank a process of its own under mpiexec
    options = {"seed": 5, "every": ka.EverySteps(1), "asynchronous": False}
    with ka.Run("kp", root="checkpoints", **options) as run:
        steps(run, run.rank)
print("done")
"""


def start(repo: Path, mode: str, kill_at: int, log: Path) -> subprocess.CompletedProcess[str]:
    """The program, in ``mode``: ``file`` (one process), ``threads`` (two thread ranks) or
    ``mpi`` (two processes under mpiexec; rank 0's are the events, and rank 0 is killed:
    mpiexec then ends the other)."""
    program = repo / "kp.py"
    program.write_text(PROGRAM)
    argv = [str(program), mode, str(kill_at), str(log)]
    command = mpiexec(2, *argv) if mode == "mpi" else [sys.executable, *argv]
    return subprocess.run(
        command,
        cwd=repo,
        env={**launcher_env(), "PYTHONPATH": str(TESTS_ROOT)},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )


def step_manifest(repo: Path, mode: str) -> Path:
    """Step 2's manifest: a checkpoint file's, or a sharded step's."""
    run = repo / "checkpoints" / RUN
    if mode == "file":
        return run / "step-00000002.h5.kaudit.json"
    return run / "step-00000002" / f"{INDEX_NAME}.kaudit.json"


def untracked(repo: Path, manifest_path: Path) -> list[str]:
    """What of the step ``manifest_path`` signs DVC does not hold here as signed: each
    object not in DVC's cache as the signed bytes, each ``.dvc`` file that does not name
    them; for a sharded step the index's tree too."""
    manifest = read_manifest(manifest_path)
    items = step_items(manifest)
    assert items is not None, f"{manifest_path}: its data is not here as signed"
    tree = manifest.checkpoint_path.with_name(TREE_NAME)
    if manifest.record.shards is not None:
        data = tree.read_bytes()
        items.append(
            FetchItem(
                tree,
                hashlib.md5(data, usedforsecurity=False).hexdigest(),
                hashlib.sha256(data).hexdigest(),
                len(data),
            )
        )
    cache = repo / ".dvc" / "cache"
    wrong = []
    for item in items:
        problem = local_mismatch(cache_object_path(cache, item.md5), item)
        if problem is not None:
            wrong.append(f"{item.checkpoint.name}: DVC's cache object: {problem}")
        if read_dvc_file(dvc_file_for(item.checkpoint)) != (item.md5, item.size):
            wrong.append(f"{item.checkpoint.name}: its .dvc file does not name it")
    return wrong


def kind(event: str) -> str:
    """What code makes ``event``: the same for every file it is made for (a cache object's
    directory, temporary link and rename; a ``.dvc`` file; a rank's shard; a git-ignore
    entry), the path itself otherwise."""
    name, path = event.split(" ", 1)
    base = path.rsplit("/", 1)[-1]
    if path.startswith(".dvc/cache/"):
        return f"{name} cache {'temporary' if base.endswith('.tmp') else 'object'}"
    if base.endswith(".dvc"):
        return f"{name} .dvc file"
    if base == ".gitignore":
        return f"{name} git-ignore entry"
    if base.startswith("rank-"):
        return f"{name} shard"
    return event


def kill_points(events: list[str], first: int) -> list[int]:
    """The events from ``first`` on to kill before: each kind of event (:func:`kind`) at
    its first and its last occurrence, and every event of a kind of its own. The same
    code made for the next file is the same kill, which leaves one more file done."""
    kinds = [kind(e) for e in events]
    return [
        i
        for i in range(first, len(events))
        if kinds[i] not in kinds[first:i] or kinds[i] not in kinds[i + 1 :]
    ]


@pytest.mark.parametrize("mode", ["file", "threads", "mpi"])
def test_a_commit_killed_anywhere_leaves_its_step_absent_or_tracked(
    project: Project, key: SigningKey, tmp_path: Path, mode: str
) -> None:
    configure_remote(project, str(tmp_path / "remote"))
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "remote")
    recorded = tmp_path / "recorded.log"
    whole = tmp_path / "whole"
    shutil.copytree(project.root, whole, symlinks=True)
    done = start(whole, mode, -1, recorded)
    assert done.returncode == 0, done.stderr
    events = recorded.read_text().splitlines()
    manifest = step_manifest(whole, mode)
    signed = f"os.rename {manifest.relative_to(whole)}"
    # The manifest's rename is the step's last event: everything it signs came before.
    assert signed in events, events
    if mode == "threads":  # (under mpiexec, rank 1 may be the one that makes it)
        assert f"os.mkdir {manifest.parent.relative_to(whole)}" in events
    outcomes: dict[str, int] = {"absent": 0, "tracked": 0}
    # Before each event, then after the commit (AFTER, not a count: two thread ranks may
    # make an event more than the recorded run, both racing to make the step directory).
    # Under mpiexec, from rank 0's first event on the index: the events before (its shard
    # written, the votes) are the same code as the thread ranks', killed at each above,
    # and a job of two processes per kill is the dearest run of the suite.
    first = 0
    if mode == "mpi":
        first = next(i for i, e in enumerate(events) if INDEX_NAME in e.rsplit("/", 1)[-1])
    for kill_at in [*kill_points(events, first), AFTER]:
        repo = tmp_path / f"k{kill_at}"
        shutil.copytree(project.root, repo, symlinks=True)
        log = tmp_path / f"k{kill_at}.log"
        killed = start(repo, mode, kill_at, log)
        where = f"killed before {events[kill_at]!r}" if kill_at < AFTER else "killed after"
        # SIGKILL, or (mpiexec) the job ended for it; never the program's own end.
        assert killed.returncode != 0, f"{where}: {killed.stdout}"
        assert mode == "mpi" or killed.returncode == -9, f"{where}: {killed.stderr}"
        assert mode == "mpi" or "done" not in killed.stdout, where  # (rank 1 may end)
        manifest = step_manifest(repo, mode)
        if not manifest.exists():
            outcomes["absent"] += 1  # never valid: the next run does it again
            continue
        outcomes["tracked"] += 1
        problems = untracked(repo, manifest)
        assert problems == [], f"{where}: step 2 is signed but {problems}"
        if outcomes["tracked"] == 1 or kill_at == AFTER:
            # What untracked() checked is what a push needs; pushed for real once the
            # step is first found signed, and once its commit has returned. Each copy is
            # a chain of its own (its own run start): each push goes to an empty remote.
            shutil.rmtree(tmp_path / "remote", ignore_errors=True)
            pushed = run_cli("push", str(repo / "checkpoints" / RUN), cwd=repo)
            assert pushed.exit_code == 0, f"{where}: {pushed.output}"
            assert "repaired" not in pushed.output, f"{where}: {pushed.output}"
    # Both outcomes happened: the kills landed before and after the manifest's rename.
    assert outcomes["absent"] >= 1, outcomes
    assert outcomes["tracked"] >= 1, outcomes


def test_a_sharded_step_whose_manifest_cannot_be_written_is_tracked_by_nothing(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 tracks the index and tree before it writes the manifest: when the manifest
    cannot be written (the disk fills up at that instant: the fault is injected where the
    manifest is written), the commit fails on every rank, and neither a shard nor the
    index nor the tree is left with a .dvc file."""

    def disk_full(manifest: Manifest) -> Manifest:
        raise ManifestError("cannot write manifest: No space left on device", path=manifest.path)

    def ranks(comm: ThreadRanks) -> None:
        with thread_run(project.root, RUN, comm) as run:
            u = np.arange(16.0).reshape(4, 4) + comm.rank
            run.checkpoint(1, {"u": u}, layout={"u": ka.Block(axis=0)})
            if comm.rank == 0:
                monkeypatch.setattr(sharded, "publish_manifest", disk_full)
            with pytest.raises(CheckpointError, match="No space left on device"):
                run.checkpoint(2, {"u": u + 1}, layout={"u": ka.Block(axis=0)})

    on_ranks(2, ranks)
    step = project.root / "checkpoints" / RUN / "step-00000002"
    assert (step / INDEX_NAME).is_file()  # written and tracked, then not signed
    assert not (step / f"{INDEX_NAME}.kaudit.json").exists()
    assert sorted(p.name for p in step.glob("*.dvc")) == []
    done = sorted(p.name for p in step.with_name("step-00000001").glob("*.dvc"))
    assert done == [f"{INDEX_NAME}.dvc", f"{TREE_NAME}.dvc", *SHARDS_DVC]
