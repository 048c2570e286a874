"""Storage.fetch: exactly the object a verified manifest names, to the checkpoint's own path,
checked before it becomes visible; never what a ``.dvc`` file says. Real DVC remotes (a
local directory and a private sshd), real git clones, real HDF5 checkpoints."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

import kronos_audit as ka
from kronos_audit._internal.fsutil import TEMP_PREFIX
from kronos_audit.errors import StorageError, TamperedData
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.storage import (
    FetchItem,
    Storage,
    cache_object_path,
    cache_settings,
    configure_remote,
    dvc_file_for,
)
from tests.helpers import git, signed_items
from tests.sshd import SSHRemote, unused_port

pytestmark = pytest.mark.slow

STEPS = (1, 2)


@dataclass(frozen=True)
class Pushed:
    """A run whose checkpoints were pushed, committed in ``origin``."""

    origin: Project
    """The repository that ran and pushed."""
    data: dict[int, bytes]
    """Each step's checkpoint bytes, as written."""


def run_and_push(project: Project) -> Pushed:
    with ka.Run("heat", root=project.root / "checkpoints", seed=3, every=ka.EverySteps(1)) as run:
        state = {"u": run.rng.random((64, 64))}
        for step in run.steps(len(STEPS)):
            state = {"u": 0.5 * state["u"] + run.rng.random((64, 64))}
            run.checkpoint(step, state)
    Storage(project).push(signed_items([ckpt(project.root, s) for s in STEPS]))
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "run")
    return Pushed(project, {s: ckpt(project.root, s).read_bytes() for s in STEPS})


def ckpt(root: Path, step: int) -> Path:
    return root / "checkpoints" / "heat" / f"step-{step:08d}.h5"


def item(checkpoint: Path) -> FetchItem:
    """What the (signed) manifest beside ``checkpoint`` records."""
    m = ka.read_manifest(checkpoint.with_name(checkpoint.name + ".kaudit.json"))
    assert m.subject_md5 is not None
    return FetchItem(checkpoint, m.subject_md5, m.subject_sha256, int(m.predicate["size"]))


def fetch(project: Project, checkpoint: Path) -> None:
    i = item(checkpoint)
    Storage(project).fetch(checkpoint, md5=i.md5, sha256=i.sha256, size=i.size)


def clone(pushed: Pushed, to: Path) -> Project:
    git(to.parent, "clone", "-q", str(pushed.origin.root), str(to))
    assert not ckpt(to, 1).exists()
    return Project(to)


def cached(project: Project, md5: str) -> Path:
    return cache_object_path(cache_settings(project)[0], md5)


def remote_object(remote: Path, md5: str) -> Path:
    return remote / "files" / "md5" / md5[:2] / md5[2:]


def leftovers(directory: Path) -> list[Path]:
    return sorted(directory.glob(TEMP_PREFIX + "*"))


@pytest.fixture
def local_remote(project: Project, tmp_path: Path) -> Path:
    path = tmp_path / "remote"
    configure_remote(project, str(path))
    return path


@pytest.fixture
def pushed(project: Project, key: SigningKey, local_remote: Path) -> Pushed:
    return run_and_push(project)


def test_fetch_from_a_local_remote_into_a_fresh_clone(pushed: Pushed, tmp_path: Path) -> None:
    here = clone(pushed, tmp_path / "clone")
    fetch(here, ckpt(here.root, 1))
    assert Storage(here).fetch_many([item(ckpt(here.root, 2))]) == {}
    for step in STEPS:
        assert ckpt(here.root, step).read_bytes() == pushed.data[step]
        assert cached(here, item(ckpt(here.root, step)).md5).read_bytes() == pushed.data[step]
    assert leftovers(ckpt(here.root, 1).parent) == []
    # DVC itself finds the work tree and its cache as the .dvc files describe them.
    out = subprocess.run(
        [sys.executable, "-m", "dvc", "status"], cwd=here.root, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "up to date" in out.stdout
    assert ka.verify(ckpt(here.root, 2).parent)[-1].ok


def test_fetch_from_the_ssh_remote_into_a_fresh_clone(
    project: Project, key: SigningKey, ssh_remote: SSHRemote, ssh_remote_dir: str, tmp_path: Path
) -> None:
    ssh_remote.configure_dvc(project.root, "storage", ssh_remote_dir)
    pushed = run_and_push(project)
    here = clone(pushed, tmp_path / "clone")
    ssh_remote.configure_dvc(here.root, "storage", ssh_remote_dir)  # the key is local config
    assert Storage(here).fetch_many([item(ckpt(here.root, s)) for s in STEPS]) == {}
    for step in STEPS:
        assert ckpt(here.root, step).read_bytes() == pushed.data[step]
        assert cached(here, item(ckpt(here.root, step)).md5).read_bytes() == pushed.data[step]
    assert leftovers(ckpt(here.root, 1).parent) == []


def test_a_tampered_ssh_remote_object_is_refused(
    project: Project, key: SigningKey, ssh_remote: SSHRemote, ssh_remote_dir: str, tmp_path: Path
) -> None:
    ssh_remote.configure_dvc(project.root, "storage", ssh_remote_dir)
    pushed = run_and_push(project)
    here = clone(pushed, tmp_path / "clone")
    ssh_remote.configure_dvc(here.root, "storage", ssh_remote_dir)
    target = ckpt(here.root, 1)
    obj = remote_object(ssh_remote.local_path(ssh_remote_dir), item(target).md5)
    with open(obj, "ab") as f:
        f.write(b"more")
    with pytest.raises(TamperedData, match="larger than the recorded"):
        fetch(here, target)
    assert not os.path.lexists(target)
    assert leftovers(target.parent) == []


def test_a_dvc_file_pointing_elsewhere_is_not_read(pushed: Pushed, tmp_path: Path) -> None:
    here = clone(pushed, tmp_path / "clone")
    target = ckpt(here.root, 1)
    other_md5 = item(ckpt(here.root, 2)).md5
    # What an attacker's .dvc file says: another object, written into the trust store.
    dvc_file_for(target).write_text(
        f"outs:\n- md5: {other_md5}\n  size: 10\n  hash: md5\n"
        "  path: ../../.kaudit/trusted-keys/evil.pub\n"
    )
    fetch(here, target)
    assert target.read_bytes() == pushed.data[1]
    assert not (here.root / ".kaudit" / "trusted-keys" / "evil.pub").exists()
    assert not ckpt(here.root, 2).exists()
    assert not cached(here, other_md5).exists()  # the .dvc file's object was not fetched


def test_a_tampered_remote_object_never_becomes_visible(
    pushed: Pushed, local_remote: Path, tmp_path: Path
) -> None:
    here = clone(pushed, tmp_path / "clone")
    target = ckpt(here.root, 1)
    obj = remote_object(local_remote, item(target).md5)
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0x01
    os.chmod(obj, 0o644)
    obj.write_bytes(bytes(data))
    with pytest.raises(TamperedData, match="sha256") as raised:
        fetch(here, target)
    assert raised.value.exit_code == 1
    assert raised.value.path == target
    assert not os.path.lexists(target)
    assert not cached(here, item(target).md5).exists()
    assert leftovers(target.parent) == []


def read_bytes_so_far() -> int:
    """Bytes this process has read through read(2) and the like (Linux)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.parametrize("grow", ["append", "sparse 20 GB"])
def test_a_remote_object_larger_than_recorded_is_refused_after_one_byte_more(
    pushed: Pushed, local_remote: Path, tmp_path: Path, grow: str
) -> None:
    here = clone(pushed, tmp_path / "clone")
    target = ckpt(here.root, 1)
    recorded = item(target)
    obj = remote_object(local_remote, recorded.md5)
    os.chmod(obj, 0o644)
    if grow == "append":
        with open(obj, "ab") as f:
            f.write(b"\0" * 4096)
    else:
        os.truncate(obj, 20 * 1024**3)
    before = read_bytes_so_far()
    with pytest.raises(TamperedData, match=f"larger than the recorded {recorded.size:,} bytes"):
        fetch(here, target)
    # Not read to its end: the recorded size and one byte more (plus what DVC reads of
    # its own configuration), however large the object claims or turns out to be.
    assert read_bytes_so_far() - before < recorded.size + 16 * 1024 * 1024
    assert not os.path.lexists(target)
    assert leftovers(target.parent) == []


def test_a_fifo_in_the_remote_is_refused_without_hanging(
    pushed: Pushed, local_remote: Path, tmp_path: Path
) -> None:
    here = clone(pushed, tmp_path / "clone")
    target = ckpt(here.root, 1)
    obj = remote_object(local_remote, item(target).md5)
    obj.unlink()
    os.mkfifo(obj)
    raised: list[BaseException] = []

    def attempt() -> None:
        try:
            fetch(here, target)
        except BaseException as e:
            raised.append(e)

    worker = threading.Thread(target=attempt, daemon=True)  # daemon: a hang cannot block exit
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "fetch hangs on a FIFO in the remote"
    (error,) = raised
    assert isinstance(error, TamperedData)
    assert "FIFO" in str(error)
    assert not os.path.lexists(target)
    assert leftovers(target.parent) == []


@pytest.mark.parametrize("what", ["file", "symlink"])
def test_an_existing_checkpoint_is_never_replaced(
    pushed: Pushed, tmp_path: Path, what: str
) -> None:
    here = clone(pushed, tmp_path / "clone")
    target = ckpt(here.root, 1)
    elsewhere = tmp_path / "elsewhere"
    if what == "file":
        target.write_bytes(b"somebody's data")
    else:
        target.symlink_to(elsewhere)  # dangling: a write through it would create elsewhere
    with pytest.raises(StorageError, match="already exists") as raised:
        fetch(here, target)
    assert raised.value.exit_code == 2
    if what == "file":
        assert target.read_bytes() == b"somebody's data"
    else:
        assert os.readlink(target) == str(elsewhere)
        assert not elsewhere.exists()
    assert leftovers(target.parent) == []


def test_a_good_cache_object_is_used_without_asking_the_remote(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    configure_remote(project, str(tmp_path / "empty-remote"))  # never pushed to: holds nothing
    with ka.Run("heat", root=project.root / "checkpoints", seed=3, every=ka.EverySteps(1)) as run:
        for step in run.steps(1):
            run.checkpoint(step, {"u": run.rng.random((64, 64))})
    target = ckpt(project.root, 1)
    data = target.read_bytes()
    recorded = item(target)
    target.unlink()
    fetch(project, target)
    assert target.read_bytes() == data
    assert cached(project, recorded.md5).read_bytes() == data
    assert leftovers(target.parent) == []


def test_a_tampered_cache_object_is_removed_and_fetched_from_the_remote(
    pushed: Pushed, caplog: pytest.LogCaptureFixture
) -> None:
    project = pushed.origin
    target = ckpt(project.root, 1)
    recorded = item(target)
    target.unlink()
    obj = cached(project, recorded.md5)
    os.chmod(obj, 0o644)
    data = bytearray(obj.read_bytes())
    data[-1] ^= 0xFF
    obj.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="kronos_audit.storage"):
        fetch(project, target)
    assert "not the signed data" in caplog.text
    assert target.read_bytes() == pushed.data[1]
    assert obj.read_bytes() == pushed.data[1]  # the bad object is gone, the good one is in
    assert leftovers(target.parent) == []


def test_an_object_missing_from_the_remote(
    pushed: Pushed, local_remote: Path, tmp_path: Path
) -> None:
    here = clone(pushed, tmp_path / "clone")
    target = ckpt(here.root, 1)
    remote_object(local_remote, item(target).md5).unlink()
    with pytest.raises(StorageError, match="not in the DVC remote") as raised:
        fetch(here, target)
    assert raised.value.exit_code == 2
    assert not os.path.lexists(target)
    assert leftovers(target.parent) == []


def test_an_unreachable_remote_is_named_in_one_line(
    pushed: Pushed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # none of the user's ~/.ssh
    pytest.importorskip("dvc_ssh")
    here = clone(pushed, tmp_path / "clone")
    configure_remote(here, f"ssh://127.0.0.1:{unused_port()}/nowhere")  # nothing listens
    failed = Storage(here).fetch_many([item(ckpt(here.root, s)) for s in STEPS])
    assert set(failed) == {ckpt(here.root, s) for s in STEPS}
    for error in failed.values():
        assert isinstance(error, StorageError)
        assert error.exit_code == 2
        assert "unreachable" in str(error)
        assert len(str(error).splitlines()) == 1
    assert not ckpt(here.root, 1).exists()
    assert leftovers(ckpt(here.root, 1).parent) == []


@pytest.mark.parametrize(
    ("md5", "sha256"),
    [("../../../.kaudit/trusted-keys/x", "0" * 64), ("A" * 32, "0" * 64), ("0" * 32, "0" * 63)],
)
def test_digests_are_checked_before_use(project: Project, md5: str, sha256: str) -> None:
    target = project.root / "step-00000001.h5"
    with pytest.raises(StorageError, match="lower-case hex digits"):
        Storage(project).fetch(target, md5=md5, sha256=sha256, size=1)
