"""What pushes leave in a DVC directory remote, and two pushes at once: DVC's partial
uploads that a killed push left are removed once provably stale, and an object another
`kaudit push` is uploading is waited for, not uploaded twice (both pushes real processes,
one stopped with SIGSTOP in the middle of its upload)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage.uploads import STALE_UPLOAD_AGE, PushLocks
from tests.helpers import KAUDIT, run_cli

HANG_GUARD = 120  # seconds; only stops a broken test from hanging, never a time limit


def one_step(project: Project, run_id: str, values: int) -> Path:
    """Run ``run_id``'s one checkpoint of ``values`` float64s; its manifest."""
    with ka.Run(run_id, root=project.root / "checkpoints", seed=3) as run:
        for step in run.steps(1):
            run.checkpoint(step, {"x": run.rng.random(values)})
    return project.root / "checkpoints" / run_id / "step-00000001.h5.kaudit.json"


def object_of(remote: Path, manifest: Path) -> Path:
    md5 = ka.read_manifest(manifest).subject_md5
    assert md5 is not None
    return remote / "files" / "md5" / md5[:2] / md5[2:]


def dvc_temporary(directory: Path, letter: str, data: bytes, age: float) -> Path:
    """A file named as DVC names an upload in progress, last written ``age`` s ago."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f".{letter * 22}.tmp"
    path.write_bytes(data)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_a_push_removes_the_partial_uploads_killed_pushes_left_and_nothing_else(
    project: Project, key: SigningKey, remote: Path
) -> None:
    manifest = one_step(project, "heat", 10_000)
    obj = object_of(remote, manifest)
    data = (manifest.parent / "step-00000001.h5").read_bytes()[:4096]
    stale = dvc_temporary(obj.parent, "a", data, STALE_UPLOAD_AGE + 60)
    fresh = dvc_temporary(obj.parent, "b", data, 5)  # maybe an upload in progress
    other_name = obj.parent / ".partial.tmp"  # not DVC's name for an upload
    other_name.write_bytes(data)
    os.utime(other_name, (0, 0))
    elsewhere = dvc_temporary(remote / "files" / "md5" / "zz", "c", data, STALE_UPLOAD_AGE * 2)

    pushed = run_cli("push", str(manifest.parent))
    assert pushed.exit_code == 0, pushed.output
    assert obj.read_bytes() == (manifest.parent / "step-00000001.h5").read_bytes()
    assert not stale.exists()
    # an upload that may be in progress, a name DVC does not give, and the directory of
    # an object this push did not upload: left as they are
    assert fresh.exists()
    assert other_name.exists()
    assert elsewhere.exists()


STOPPED_MIDWAY = """
import os, signal, sys

from kronos_audit.cli import main

remote = os.path.realpath(sys.argv[1])


def hook(event, args):
    # DVC writes an upload under a temporary name, then renames it to the object's: stop
    # just before that rename, the upload's bytes all there, the object not yet.
    if event == "os.rename" and os.fsdecode(args[0]).endswith(".tmp"):
        if os.path.realpath(os.fsdecode(args[0])).startswith(remote + os.sep):
            os.kill(os.getpid(), signal.SIGSTOP)


sys.addaudithook(hook)
sys.argv = ["kaudit", *sys.argv[2:]]
main()
"""
"""``kaudit`` that stops itself (SIGSTOP) in the middle of its first upload into the DVC
directory remote ``argv[1]``; the rest of argv is its command line."""


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (``T`` in /proc), or gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return True
    return fields[0] in ("T", "Z")


def test_a_second_push_waits_for_the_object_the_first_is_uploading(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    big = one_step(project, "big", 40_000_000)  # 320 MB: its copy takes a while
    small = one_step(project, "small", 1_000)
    big_object, small_object = object_of(remote, big), object_of(remote, small)
    size = (big.parent / "step-00000001.h5").stat().st_size

    def push(*args: str, midway: bool = False) -> subprocess.Popen[str]:
        command = [sys.executable, "-c", STOPPED_MIDWAY, str(remote)] if midway else KAUDIT
        return subprocess.Popen(
            [*command, "push", "--json", *args],
            cwd=project.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def uploading() -> bool:
        directory = big_object.parent
        return directory.is_dir() and any(n.endswith(".tmp") for n in os.listdir(directory))

    first = push(str(big), midway=True)  # stops itself in the middle, holding its lock
    deadline = time.monotonic() + HANG_GUARD
    while not stopped(first.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert first.poll() is None, first.communicate()
        assert uploading(), "the first push was not caught midway"
        assert not big_object.exists()
        second = push()  # every checkpoint: the big one and the small one
        deadline = time.monotonic() + HANG_GUARD
        while not small_object.exists() and second.poll() is None:
            assert time.monotonic() < deadline, "the second push did not upload its own object"
            time.sleep(0.05)
        time.sleep(1)  # a second push that did not wait would be uploading the big one now
        assert second.poll() is None, second.communicate()
        assert not big_object.exists()
        # the first push's upload alone
        assert len([n for n in os.listdir(big_object.parent) if n.endswith(".tmp")]) == 1
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=HANG_GUARD)
    assert first.returncode == 0, err
    assert json.loads(out)["uploaded"] == 1
    out, err = second.communicate(timeout=HANG_GUARD)
    assert second.returncode == 0, err
    done = json.loads(out)
    assert done["uploaded"] == 1  # the small one: the big one was the first push's
    assert sorted(done["pushed"]) == [
        "checkpoints/big/step-00000001.h5",
        "checkpoints/small/step-00000001.h5",
    ]
    assert big_object.stat().st_size == size
    assert [n for n in os.listdir(big_object.parent) if n.endswith(".tmp")] == []


HOLDER = """
import os, sys, time
from pathlib import Path
from kronos_audit.storage.uploads import PushLocks

locks = PushLocks("remote", Path(sys.argv[1]))
assert locks.take(["0" * 32]) == ["0" * 32]
child = os.fork()
if child == 0:  # a pool's worker, forked while the push holds its lock, living on
    time.sleep(HANG_GUARD)
    os._exit(0)
print(child, flush=True)
time.sleep(HANG_GUARD)
"""


def test_a_push_killed_holding_a_lock_frees_it_though_its_forked_child_lives(
    tmp_path: Path,
) -> None:
    holder = subprocess.Popen(
        [*KAUDIT[:1], "-c", f"HANG_GUARD = {HANG_GUARD}\n" + HOLDER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    child = int(holder.stdout.readline())
    try:
        with PushLocks("remote", tmp_path) as other:
            assert other.take(["0" * 32]) == []  # held: the push is uploading it
            holder.send_signal(signal.SIGSTOP)  # hung, holding it
            other.wait(["0" * 32], time.monotonic() + 0.5)  # bounded: a hang never blocks
            assert other.take(["0" * 32]) == []  # (not taken: uploaded unlocked, then)
            holder.send_signal(signal.SIGCONT)
        holder.send_signal(signal.SIGKILL)  # the push, killed for real; its child lives on
        holder.wait(timeout=HANG_GUARD)
        os.kill(child, 0)  # still there
        with PushLocks("remote", tmp_path) as other:
            assert other.take(["0" * 32]) == ["0" * 32]  # the dead push's lock is free
    finally:
        holder.kill()
        holder.wait(timeout=HANG_GUARD)
        holder.stdout.close()
        os.kill(child, signal.SIGKILL)
