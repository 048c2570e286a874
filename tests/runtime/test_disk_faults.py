"""Storage faults for real: the run's file system fills up or turns read-only mid-run.

The run's root directory is a tmpfs of its own (the ``tmpfs`` fixture), sized so that one
checkpoint does not fit, or remounted read-only between two checkpoints. The previous
checkpoint must stay intact and restorable, the failure must be one clear line, nothing
partial may be left under a checkpoint's name, and once the space (or write access) is
back a restart must continue from where the run was and end bitwise equal to a run that
never failed, with a chain ``kaudit verify --trusted-key`` passes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kronos_audit.checkpoint.hdf5 import METADATA_MARGIN
from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.signing.writer_lock import HOLDER_NAME, LOCK_NAME
from tests.conftest import Tmpfs
from tests.helpers import recorded_once, run_cli

PAGE = 4096  # what tmpfs counts in
HANG_GUARD = 120.0  # seconds; only stops a broken test from hanging CI, never a timing claim
# Two checkpoints chained before the failing one, and one after it: the restart writes a
# checkpoint again and links it to the chain (in async mode the failure of step FAILS_AT
# surfaces at the next step).
STEPS = 4
FAILS_AT = 3
N = 262_144  # float64: a 2 MiB state
# Arrays of 10 float64, each in a group of its own (as a model's layers are): a group and
# its array take some 1,500 bytes of the file, almost all of it HDF5's structures, which
# outgrow the data by more than the writer's METADATA_MARGIN (1 MiB) once there are some
# 750 of them; with fewer, "many" would be refused by the room check as "big" is (the
# test checks that it is not). 1,200 leave the file further past the margin (some 700 KB)
# than 4,000 arrays side by side in one group did (550 KB), with under a third of the
# datasets to write, hash, sign and verify.
MANY = 1200

pytestmark = pytest.mark.slow

PROGRAM = f"""
import hashlib, json, sys
import numpy as np
import kronos_audit as ka
mode, layout, pause_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
big = layout == "big"
with ka.Run("disk", seed=7, every=ka.EverySteps(1), asynchronous=mode == "async") as run:
    state = run.restore()
    print("restored", run.step, flush=True)
    if state is None:
        # One large array (written by pwrite), or many small ones, each in a group (by
        # HDF5 itself, whose own structures then take more room than the data).
        if big:
            state = {{"u": np.zeros({N})}}
        else:
            state = {{f"g{{i}}": {{"w": np.zeros(10)}} for i in range({MANY})}}
    for step in run.steps({STEPS}):
        if big:
            state = {{"u": state["u"] + run.rng.random({N})}}
        else:
            state = {{k: {{"w": g["w"] + run.rng.random(10)}} for k, g in sorted(state.items())}}
        run.checkpoint(step, state)
        if step == pause_after:
            run.wait()
            print("paused", step, flush=True)
            sys.stdin.readline()  # the test changes the file system meanwhile
arrays = [state["u"]] if big else [state[k]["w"] for k in sorted(state)]
digest = hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()
print(json.dumps({{"step": run.step, "digest": digest}}))
"""


def start(
    root: Path, mode: str, layout: str = "big", pause_after: int = 0
) -> subprocess.Popen[str]:
    program = root / "disk.py"
    program.write_text(PROGRAM)
    return subprocess.Popen(
        [sys.executable, str(program), mode, layout, str(pause_after)],
        cwd=root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], stdin: str = "") -> tuple[str, str]:
    try:
        return proc.communicate(stdin, timeout=HANG_GUARD)
    finally:
        proc.kill()


def result(stdout: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(stdout.splitlines()[-1])
    return doc


def reference(
    project: Project, factory: pytest.TempPathFactory, layout: str = "big"
) -> tuple[dict[str, Any], int, int]:
    """The final state of a run that never failed (on the ordinary file system), and the
    :func:`checkpoint_size` of its checkpoints. One run for the whole session: every test
    of a layout runs the same program to the same steps, so it would only repeat it. It
    runs in a copy of the first asking test's project, with that test's key."""

    def record(into: Path) -> None:
        repo = into / "repo"
        shutil.copytree(project.root, repo, symlinks=True)
        proc = start(repo, "sync", layout)
        out, err = finish(proc)
        assert proc.returncode == 0, err
        size, usage = checkpoint_size(repo)
        (into / "reference.json").write_text(json.dumps([result(out), size, usage]))
        shutil.rmtree(repo)  # only the figures are shared

    copy = recorded_once(f"disk-faults-{layout}", factory, record)
    want, size, usage = json.loads((copy / "reference.json").read_text())
    return want, size, usage


def failure_line(stderr: str, step: int) -> str:
    """The error the program died of: one line naming the step, and no traceback (each
    later failure, if any, a line after it, as a note on it; a warning may come before)."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    (at,) = [i for i, x in enumerate(lines) if x.startswith("kaudit: error: ")]
    line, notes = lines[at], lines[at + 1 :]
    assert f"writing the checkpoint of step {step} failed: " in line, line
    assert all(n.startswith("kaudit: a later background failure too: ") for n in notes), stderr
    return line


def assert_nothing_partial(run_dir: Path, last_good: int) -> None:
    """Every checkpoint up to ``last_good`` complete, nothing of a later one, no temporary."""
    names = sorted(p.name for p in run_dir.iterdir())
    expected = sorted(
        [".gitignore", HOLDER_NAME, LOCK_NAME]  # the run's writer lock, and who holds it
        + [
            f"step-{s:08d}.h5{suffix}"
            for s in range(1, last_good + 1)
            for suffix in ("", ".dvc", ".kaudit.json")
        ]
    )
    assert names == expected


def verify(project: Project, key: SigningKey, run_dir: Path) -> None:
    # In-process: what is tested is the chain kaudit verify passes, not its process.
    pem = project.root.parent / "tester.pub"
    pem.write_bytes(public_pem(key.private_key.public_key()))
    done = run_cli("verify", str(run_dir), "--trusted-key", str(pem), cwd=project.root)
    assert done.exit_code == 0, done.output


def paused_before_the_failing_step(project: Project, mode: str) -> subprocess.Popen[str]:
    """The program, started and paused once checkpoint FAILS_AT - 1 is durable: the test
    changes the file system, then lets it go on (``finish(proc, "go on\\n")``)."""
    proc = start(project.root, mode, pause_after=FAILS_AT - 1)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("paused"):
            break
    return proc


def assert_the_run_continues(
    project: Project,
    key: SigningKey,
    run_dir: Path,
    want: dict[str, Any],
    mode: str,
    layout: str = "big",
) -> None:
    """Once the file system is back, the run resumes from checkpoint FAILS_AT - 1, ends
    bitwise equal to an uninterrupted run (``want``) with every checkpoint complete, and
    its chain verifies."""
    proc = start(project.root, mode, layout)
    out, err = finish(proc)
    assert proc.returncode == 0, err
    assert f"restored {FAILS_AT - 1}" in out
    assert result(out) == want
    assert_nothing_partial(run_dir, STEPS)
    verify(project, key, run_dir)


def checkpoint_size(root: Path) -> tuple[int, int]:
    """The size of the program's checkpoint file (every one is as large), and the most
    room one checkpoint takes on a tmpfs with its .dvc file and manifest (whole pages)."""
    run_dir = root / "checkpoints" / "disk"
    (size,) = {p.stat().st_size for p in run_dir.glob("*.h5")}
    usage = max(
        sum(
            -(-p.stat().st_size // PAGE) * PAGE
            for p in (h5, h5.with_name(h5.name + ".dvc"), h5.with_name(h5.name + ".kaudit.json"))
        )
        for h5 in run_dir.glob("*.h5")
    )
    return size, usage


@pytest.mark.parametrize(
    ("layout", "why"),
    [
        ("big", "not enough space"),  # refused before HDF5 starts: the room is checked
        ("many", "No space left on device"),  # HDF5 itself runs out (its structures)
    ],
)
def test_disk_full_keeps_the_last_checkpoint_and_the_restart_continues(
    project: Project,
    key: SigningKey,
    tmpfs: Callable[..., Tmpfs],
    tmp_path_factory: pytest.TempPathFactory,
    layout: str,
    why: str,
) -> None:
    # One uninterrupted run, the reference of both modes (they write the same steps).
    want, size, usage = reference(project, tmp_path_factory, layout)
    # Room for FAILS_AT - 1 checkpoints and the .gitignore, and then less than the next
    # one needs: less than the room the writer asks for (big), or enough for that but
    # less than the file (many).
    room = METADATA_MARGIN + size // 2 if layout == "big" else size - 64 * 1024
    if layout == "many":  # the room check passes: HDF5 itself runs out
        assert room >= MANY * 10 * 8 + METADATA_MARGIN, (room, size)
    checkpoints = project.root / "checkpoints"
    run_dir = checkpoints / "disk"
    full = (FAILS_AT - 1) * usage + PAGE + room
    subprocess.run(["rm", "-rf", str(checkpoints)], check=True)
    disk = tmpfs(checkpoints, full)
    # Both modes for "big"; "many" in the loop's own thread only. In either mode the write
    # runs the same code (the writer's: room check, HDF5, the temporary file taken back);
    # what async adds, a failure in the background thread surfacing at the next step and
    # the restart after it, "big" shows, whatever inside the write failed.
    for mode in ("sync", "async") if layout == "big" else ("sync",):
        if mode == "async":  # the same disk, emptied and shrunk again
            subprocess.run(["rm", "-rf", *map(str, checkpoints.iterdir())], check=True)
            disk.remount(f"size={full}")
        proc = start(project.root, mode, layout)
        out, err = finish(proc)
        assert proc.returncode == 2, (mode, out)  # `kaudit run` does not restart it
        assert why in failure_line(err, FAILS_AT), mode
        assert_nothing_partial(run_dir, FAILS_AT - 1)

        disk.remount(f"size={4 * STEPS * usage}")
        assert_the_run_continues(project, key, run_dir, want, mode, layout)


def test_no_room_for_the_manifest_takes_the_checkpoint_back(
    project: Project,
    key: SigningKey,
    tmpfs: Callable[..., Tmpfs],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    want, _, usage = reference(project, tmp_path_factory)
    subprocess.run(["rm", "-rf", str(project.root / "checkpoints")], check=True)
    # Out of inodes, not bytes: the root, the run's directory, its .gitignore and writer
    # lock and holder files, three files for each checkpoint; checkpoint FAILS_AT gets its
    # file and .dvc file, and no manifest.
    inodes = 5 + 3 * (FAILS_AT - 1) + 2
    disk = tmpfs(project.root / "checkpoints", 4 * STEPS * usage, f"nr_inodes={inodes}")
    run_dir = project.root / "checkpoints" / "disk"
    proc = start(project.root, "sync")
    out, err = finish(proc)
    assert proc.returncode == 2, out
    line = failure_line(err, FAILS_AT)
    assert "cannot write manifest: No space left on device" in line
    assert_nothing_partial(run_dir, FAILS_AT - 1)

    disk.remount(f"nr_inodes={4 * inodes}")
    assert_the_run_continues(project, key, run_dir, want, "sync")


def test_dvc_cache_full_leaves_no_checkpoint_untracked_and_says_so(
    project: Project,
    key: SigningKey,
    tmpfs: Callable[..., Tmpfs],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    want, size, usage = reference(project, tmp_path_factory)
    subprocess.run(["rm", "-rf", str(project.root / "checkpoints")], check=True)
    # The cache on the same file system, by copy: each checkpoint takes its size twice.
    # Checkpoint FAILS_AT fits (with the margin the writer asks for), its cache copy not.
    disk = tmpfs(
        project.root / "checkpoints",
        (FAILS_AT - 1) * (usage + size) + 2 * PAGE + size + METADATA_MARGIN + size // 4,
    )
    config = project.root / ".dvc" / "config"
    config.write_text(
        config.read_text().replace("[cache]", "[cache]\n    dir = ../checkpoints/.cache", 1)
    )
    subprocess.run(
        [sys.executable, "-m", "dvc", "config", "cache.type", "copy"], cwd=project.root, check=True
    )
    assert "../checkpoints/.cache" in config.read_text()
    run_dir = project.root / "checkpoints" / "disk"
    proc = start(project.root, "async")
    out, err = finish(proc)
    assert proc.returncode == 2, out
    assert "No space left on device" in failure_line(err, FAILS_AT)
    assert_nothing_partial(run_dir, FAILS_AT - 1)
    cache = project.root / "checkpoints" / ".cache" / "files" / "md5"
    assert not [p for p in cache.rglob("*") if p.is_file() and p.name.startswith(".")]

    disk.remount(f"size={4 * STEPS * usage}")
    assert_the_run_continues(project, key, run_dir, want, "async")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_read_only_file_system_keeps_the_last_checkpoint_and_the_restart_continues(
    project: Project,
    key: SigningKey,
    tmpfs: Callable[..., Tmpfs],
    tmp_path_factory: pytest.TempPathFactory,
    mode: str,
) -> None:
    want, _, usage = reference(project, tmp_path_factory)
    subprocess.run(["rm", "-rf", str(project.root / "checkpoints")], check=True)
    disk = tmpfs(project.root / "checkpoints", 4 * STEPS * usage)
    run_dir = project.root / "checkpoints" / "disk"
    proc = paused_before_the_failing_step(project, mode)
    disk.remount("ro")  # between two checkpoints: no file on it is open for writing
    out, err = finish(proc, "go on\n")
    assert proc.returncode == 2, out
    assert "Read-only file system" in failure_line(err, FAILS_AT)
    assert_nothing_partial(run_dir, FAILS_AT - 1)

    disk.remount("rw")
    assert_the_run_continues(project, key, run_dir, want, mode)


def test_read_only_dvc_cache_leaves_no_checkpoint_untracked_and_says_so(
    project: Project,
    key: SigningKey,
    tmpfs: Callable[..., Tmpfs],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    want, _, usage = reference(project, tmp_path_factory)
    subprocess.run(["rm", "-rf", str(project.root / "checkpoints")], check=True)
    # The run's directory stays writable; the cache's file system turns read-only.
    cache_fs = tmpfs(project.root / "cache", 4 * STEPS * usage)
    subprocess.run(
        [sys.executable, "-m", "dvc", "cache", "dir", str(cache_fs.where)],
        cwd=project.root,
        check=True,
    )
    run_dir = project.root / "checkpoints" / "disk"
    proc = paused_before_the_failing_step(project, "async")
    cache_fs.remount("ro")
    out, err = finish(proc, "go on\n")
    assert proc.returncode == 2, out
    line = failure_line(err, FAILS_AT)
    assert "DVC's cache" in line
    assert "Read-only file system" in line
    assert_nothing_partial(run_dir, FAILS_AT - 1)

    cache_fs.remount("rw")
    assert_the_run_continues(project, key, run_dir, want, "async")
