"""Snapshot: hash, record provenance, sign, write the manifest (kronos_audit.signing.snapshot)."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.formats import PICKLE_NOTE
from kronos_audit.checkpoint.layout import manifest_path_for
from kronos_audit.errors import (
    CheckpointError,
    Error,
    ProjectError,
    RunLocked,
    SigningKeyError,
    UsageError,
)
from kronos_audit.keys.home import generate_key
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.provenance.environment import environment
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.storage import cache_object_path, cache_settings, dvc_file_for, link_into_cache
from kronos_audit.verification.batch import verify
from tests.conftest import Tmpfs
from tests.helpers import KAUDIT, assert_bad_input, git, run_cli, write_checkpoint


def leftovers(root: Path) -> list[Path]:
    """Manifests and temporary files anywhere under ``root`` (git's own files aside)."""
    return sorted(
        p
        for pattern in ("*.kaudit.json", ".kaudit-tmp-*")
        for p in root.rglob(pattern)
        if ".git" not in p.parts
    )


def test_snapshot_writes_a_signed_manifest_beside_the_checkpoint(
    project: Project, key: SigningKey, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project.root / "checkpoints")
    before = dt.datetime.now(dt.UTC)
    (m,) = snapshot(
        checkpoint,
        run="heat-2d",
        step=1,
        seeds=[1234, 5],
        command=["python", "solver.py"],
        attributes={"dt": 0.01},
    )
    assert m.path == manifest_path_for(checkpoint)
    assert m.path.is_file()
    assert read_manifest(m.path) == m
    p = m.predicate
    assert (p["run"], p["step"], p["parent"], p["parent_manifest"]) == ("heat-2d", 1, None, None)
    assert p["seeds"] == (1234, 5)
    assert p["command"] == ("python", "solver.py")
    assert p["cwd"] == "checkpoints"
    assert dict(p["attributes"]) == {"dt": 0.01}
    assert p["size"] == checkpoint.stat().st_size
    assert p["git"]["commit"] == git(project.root, "rev-parse", "HEAD").strip()
    assert p["git"]["dirty"] is False
    assert p["environment"]["digest"] == environment()["digest"]
    created = dt.datetime.strptime(p["created"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    assert before - dt.timedelta(seconds=1) <= created <= dt.datetime.now(dt.UTC)
    assert m.subject_name == "checkpoints/run1/step-00000001.h5"
    assert m.subject_sha256 == hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert [s.keyid for s in m.envelope.signatures] == [key.key_id]
    assert verify(m.path)[0].ok


def test_several_checkpoints_get_one_manifest_each(project: Project, key: SigningKey) -> None:
    shards = [write_checkpoint(project.root / "ck" / f"rank{i}.h5", seed=i) for i in range(3)]
    manifests = snapshot(shards, run="mpi", step=0)
    assert [m.path for m in manifests] == [manifest_path_for(s) for s in shards]
    assert len({m.subject_sha256 for m in manifests}) == 3
    assert all(r.ok for r in verify([m.path for m in manifests]))


def test_a_dirty_tree_is_recorded_with_its_patch(project: Project, key: SigningKey) -> None:
    (project.root / "solver.py").write_text("print('experimental')\n")
    ckpt = write_checkpoint(project.root / "ck" / "s.h5")
    (m,) = snapshot(ckpt, run="r", step=0)
    g = m.predicate["git"]
    assert g["dirty"] is True
    patch = project.root / ".kaudit" / "patches" / f"{g['patch_sha256']}.patch"
    assert hashlib.sha256(patch.read_bytes()).hexdigest() == g["patch_sha256"]
    assert b"experimental" in patch.read_bytes()


def test_a_non_hdf5_checkpoint_is_covered_by_its_file_digest(
    project: Project, key: SigningKey
) -> None:
    blob = project.root / "ck" / "model.pt"
    blob.parent.mkdir()
    blob.write_bytes(b"weights" * 1000)
    (m,) = snapshot(blob, run="r", step=0)
    assert m.datasets is None
    (result,) = verify(m.path)
    assert result.ok
    assert [c.name for c in result.checks] == [
        "signature",
        "place",
        "file digest",
        "datasets",
        "parent link",
    ]


def test_parent_link_is_recorded(project: Project, key: SigningKey) -> None:
    a = write_checkpoint(project.root / "ck" / "a.h5", seed=1)
    b = write_checkpoint(project.root / "ck" / "b.h5", seed=2)
    (ma,) = snapshot(a, run="r", step=10)
    (mb,) = snapshot(b, run="r", step=20, parent=ma.path)
    assert mb.parent == hashlib.sha256(ma.path.read_bytes()).hexdigest()
    assert mb.predicate["parent_manifest"] == "ck/a.h5.kaudit.json"


@pytest.mark.parametrize(
    ("run", "step", "message"),
    [
        ("other-run", 20, "parent belongs to run 'r'"),
        ("r", 5, "parent is at step 10, not before step 5"),
        ("r", 10, "parent is at step 10, not before step 10"),
    ],
)
def test_a_parent_that_cannot_precede_is_refused(
    project: Project, key: SigningKey, run: str, step: int, message: str
) -> None:
    a = write_checkpoint(project.root / "ck" / "a.h5", seed=1)
    b = write_checkpoint(project.root / "ck" / "b.h5", seed=2)
    (ma,) = snapshot(a, run="r", step=10)
    with pytest.raises(UsageError, match=message) as info:
        snapshot(b, run=run, step=step, parent=ma.path)
    assert info.value.exit_code == 2
    assert info.value.path == ma.path
    assert leftovers(project.root) == [ma.path]


def test_a_missing_checkpoint_leaves_nothing_behind(project: Project, key: SigningKey) -> None:
    present = write_checkpoint(project.root / "ck" / "rank0.h5")
    missing = project.root / "ck" / "rank1.h5"
    with pytest.raises(CheckpointError, match="checkpoint file not found") as info:
        snapshot([present, missing], run="r", step=0)
    assert info.value.path == missing
    assert leftovers(project.root) == []


def test_an_unreadable_hdf5_checkpoint_leaves_nothing_behind(
    project: Project, key: SigningKey
) -> None:
    good = write_checkpoint(project.root / "ck" / "good.h5")
    bad = project.root / "ck" / "bad.h5"
    bad.write_bytes(good.read_bytes()[:8] + os.urandom(4096))
    with pytest.raises(CheckpointError, match="not a readable HDF5 file") as info:
        snapshot([good, bad], run="r", step=0)
    assert info.value.path == bad
    assert leftovers(project.root) == []


def test_no_key_held(project: Project, checkpoint: Path) -> None:
    with pytest.raises(SigningKeyError, match="no signing key"):
        snapshot(checkpoint, run="r", step=0)
    assert leftovers(project.root) == []


def test_an_unknown_key_name(project: Project, key: SigningKey, checkpoint: Path) -> None:
    with pytest.raises(SigningKeyError, match="no signing key named 'nobody'"):
        snapshot(checkpoint, run="r", step=0, key="nobody")
    assert leftovers(project.root) == []


def test_a_key_can_be_passed_directly(project: Project, checkpoint: Path) -> None:
    signer = generate_key("direct")
    project.trust_store().add(signer.private_key.public_key(), "direct")
    generate_key("another")  # two held: only an explicit key avoids the ambiguity
    (m,) = snapshot(checkpoint, run="r", step=1, key=signer)
    assert m.envelope.signatures[0].keyid == signer.key_id


def test_outside_a_git_repository(tmp_path: Path, key: SigningKey) -> None:
    ckpt = write_checkpoint(tmp_path / "loose" / "s.h5")
    with pytest.raises(ProjectError, match="not inside a git repository"):
        snapshot(ckpt, run="r", step=0)
    assert leftovers(tmp_path / "loose") == []


def test_a_repository_without_kaudit_init(git_repo: Path) -> None:
    generate_key("k")
    ckpt = write_checkpoint(git_repo / "s.h5")
    with pytest.raises(ProjectError, match="kaudit init"):
        snapshot(ckpt, run="r", step=0)
    assert leftovers(git_repo) == []


def test_checkpoints_in_two_repositories_are_refused(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    a = write_checkpoint(project.root / "a.h5")
    b = write_checkpoint(other / "b.h5")
    with pytest.raises(UsageError, match="not in the same repository"):
        snapshot([a, b], run="r", step=0)
    assert leftovers(project.root) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"run": "", "step": 0}, "run id must not be empty"),
        ({"run": "r", "step": -1}, "step must be >= 0"),
    ],
)
def test_bad_run_or_step(
    project: Project, key: SigningKey, checkpoint: Path, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        snapshot(checkpoint, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="no checkpoint given"):
        snapshot([], run="r", step=0)
    assert leftovers(project.root) == []


def test_errors_render_as_one_line_naming_the_file(project: Project, key: SigningKey) -> None:
    missing = project.root / "ck" / "gone.h5"
    with pytest.raises(Error) as info:
        snapshot(missing, run="r", step=0)
    assert str(info.value) == f"{missing}: checkpoint file not found"
    assert "\n" not in str(info.value)


# -- the file snapshot signs: a regular file, left as it is, named for its step ----------------


def nothing_written(ckpt: Path) -> None:
    assert not manifest_path_for(ckpt).exists()
    assert not dvc_file_for(ckpt).exists()
    assert not (ckpt.parent / ".gitignore").exists()


def snapshot_cli(ckpt: Path, step: int = 1) -> list[str]:
    return ["snapshot", str(ckpt), "--run", "r", "--step", str(step)]


def test_a_symlinked_checkpoint_is_refused(project: Project, key: SigningKey) -> None:
    real = write_checkpoint(project.root / "elsewhere" / "real.h5")
    mode = real.stat().st_mode
    link = project.root / "ck" / "s.h5"
    link.parent.mkdir()
    link.symlink_to(real)
    assert_bad_input(run_cli(*snapshot_cli(link)), str(link), "is a symbolic link")
    nothing_written(link)
    nothing_written(real)
    assert link.is_symlink()
    assert real.stat().st_mode == mode


def test_an_empty_directory_is_refused(project: Project, key: SigningKey) -> None:
    folder = project.root / "ck" / "s.h5"
    folder.mkdir(parents=True)
    assert_bad_input(run_cli(*snapshot_cli(folder)), str(folder), "holds no file")
    nothing_written(folder)


def test_a_fifo_is_refused_and_never_waited_on(project: Project, key: SigningKey) -> None:
    fifo = project.root / "ck" / "s.h5"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    # A subprocess first: if the FIFO made kaudit wait, this times out instead of hanging.
    done = subprocess.run(
        [*KAUDIT, *snapshot_cli(fifo)],
        cwd=project.root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    shown = fifo.relative_to(project.root)  # named from where the command stands
    assert done.stderr == f"kaudit: error: {shown}: is a FIFO, not a regular file\n"
    assert_bad_input(run_cli(*snapshot_cli(fifo)), str(fifo), "is a FIFO, not a regular file")
    nothing_written(fifo)


def test_a_device_is_refused(project: Project, key: SigningKey) -> None:
    device = project.root / "ck" / "s.h5"
    device.parent.mkdir()
    try:
        os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # what /dev/zero is
    except PermissionError:
        pytest.skip("making a device node needs privileges this test does not have")
    assert_bad_input(run_cli(*snapshot_cli(device)), str(device), "is a device")
    nothing_written(device)


def test_one_bad_checkpoint_among_several_leaves_nothing(project: Project, key: SigningKey) -> None:
    good = write_checkpoint(project.root / "ck" / "a.h5")
    fifo = project.root / "ck" / "b.h5"
    os.mkfifo(fifo)
    assert_bad_input(
        run_cli("snapshot", str(good), str(fifo), "--run", "r", "--step", "1"), str(fifo)
    )
    nothing_written(good)


@pytest.mark.parametrize("cache_type", [None, "reflink,copy", "hardlink", "symlink,hardlink"])
def test_snapshot_never_changes_the_mode_of_the_users_file(
    project: Project, key: SigningKey, cache_type: str | None
) -> None:
    # None: what `kaudit init` set (reflink,hardlink,symlink,copy); reflink,copy: DVC's own.
    if cache_type is not None:
        git(project.root, "config", "-f", ".dvc/config", "cache.type", cache_type)
    ckpt = write_checkpoint(project.root / "ck" / "s.h5")
    ckpt.chmod(0o640)
    inode = ckpt.stat().st_ino
    data = ckpt.read_bytes()
    assert run_cli(*snapshot_cli(ckpt)).exit_code == 0
    assert not ckpt.is_symlink()  # never moved into the cache
    assert ckpt.stat().st_ino == inode
    assert stat.S_IMODE(ckpt.stat().st_mode) == 0o640
    assert ckpt.read_bytes() == data
    md5 = read_manifest(manifest_path_for(ckpt)).subject_md5
    assert md5 == hashlib.md5(data).hexdigest()
    cache_dir, _ = cache_settings(project)
    obj = cache_object_path(cache_dir, md5)
    assert obj.read_bytes() == data
    # Never linked, whatever cache.type allows: a rewrite in place under the user's name
    # must not reach the signed object. The copy is read-only, as DVC keeps its cache.
    assert obj.stat().st_ino != inode
    assert not stat.S_IMODE(obj.stat().st_mode) & 0o222


def test_a_symlink_only_cache_takes_a_copy_of_the_users_file(
    project: Project, key: SigningKey
) -> None:
    git(project.root, "config", "-f", ".dvc/config", "cache.type", "symlink")
    ckpt = write_checkpoint(project.root / "ck" / "s.h5")
    data = ckpt.read_bytes()
    assert run_cli(*snapshot_cli(ckpt)).exit_code == 0
    assert not ckpt.is_symlink()  # a symbolic link would move the user's file away
    assert ckpt.read_bytes() == data
    cache_dir, _ = cache_settings(project)
    obj = cache_object_path(cache_dir, hashlib.md5(data).hexdigest())
    assert obj.read_bytes() == data
    assert not obj.is_symlink()


def test_the_runtime_still_makes_its_own_files_read_only(project: Project, key: SigningKey) -> None:
    # The runtime created its checkpoints: they may be made read-only and linked (owned).
    git(project.root, "config", "-f", ".dvc/config", "cache.type", "hardlink")
    ckpt = write_checkpoint(project.root / "ck" / "mine.h5")
    ckpt.chmod(0o640)
    cache_dir, types = cache_settings(project)
    md5 = hashlib.md5(ckpt.read_bytes()).hexdigest()
    assert link_into_cache(ckpt, cache_object_path(cache_dir, md5), types, owned=True) == (
        "hardlink"
    )
    assert stat.S_IMODE(ckpt.stat().st_mode) == 0o444


@pytest.mark.parametrize(
    ("name", "step", "ok"),
    [
        ("step-00000005.h5", 5, True),
        ("step-5.h5", 5, True),
        ("step-00000005.h5", 6, False),
        ("step-5.h5", 50, False),
        ("step-0000000000000000000000000000000000000000000000000000000000000007.h5", 8, False),
        ("step-5.h5.bak", 6, False),  # verify reads step 5 from it too
        ("step-5.h5.bak", 5, True),
        ("step-5", 6, False),
        ("step-5x.h5", 6, True),  # not a step name
        ("model-step-5.h5", 6, True),
    ],
)
def test_a_step_name_must_agree_with_the_step(
    project: Project, key: SigningKey, name: str, step: int, ok: bool
) -> None:
    ckpt = write_checkpoint(project.root / "ck" / name)
    result = run_cli(*snapshot_cli(ckpt, step))
    if ok:
        assert result.exit_code == 0, result.output
        assert read_manifest(manifest_path_for(ckpt)).step == step
        return
    said = int(name.removeprefix("step-").split(".")[0])
    assert_bad_input(
        result, str(ckpt), f"the name says step {said}, but the step to sign is {step}"
    )
    nothing_written(ckpt)


# -- a checkpoint is signed once, unless asked; what a manifest cannot cover is said ----------


def recorded_state(ckpt: Path) -> dict[str, bytes]:
    """The bytes of everything snapshot writes for ``ckpt``."""
    return {
        p.name: p.read_bytes()
        for p in (manifest_path_for(ckpt), dvc_file_for(ckpt), ckpt.parent / ".gitignore")
    }


def test_a_checkpoint_with_a_manifest_is_not_signed_again_unless_forced(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (first,) = snapshot(checkpoint, run="r", step=1, seeds=[1])
    before = recorded_state(checkpoint)
    with pytest.raises(UsageError) as info:
        snapshot(checkpoint, run="r", step=1, seeds=[2])
    assert str(info.value) == (
        f"{checkpoint}: already has a manifest, step-00000001.h5.kaudit.json: to sign it "
        "again and replace that manifest, give --force (force=True from Python)"
    )
    assert info.value.exit_code == 2
    assert recorded_state(checkpoint) == before
    (second,) = snapshot(checkpoint, run="r", step=1, seeds=[2], force=True)
    assert second.predicate["seeds"] == (2,)
    assert read_manifest(manifest_path_for(checkpoint)) == second != first
    assert verify(second.path)[0].ok


def test_one_signed_checkpoint_among_several_leaves_the_others_unsigned(
    project: Project, key: SigningKey
) -> None:
    signed = write_checkpoint(project.root / "ck" / "a.h5", seed=1)
    fresh = write_checkpoint(project.root / "other" / "b.h5", seed=2)
    snapshot(signed, run="r", step=0)
    with pytest.raises(UsageError, match="already has a manifest") as info:
        snapshot([fresh, signed], run="r", step=0)
    assert info.value.path == signed
    nothing_written(fresh)


def test_the_cli_refuses_to_sign_again_in_one_line_and_forces(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    assert run_cli(*snapshot_cli(checkpoint)).exit_code == 0
    before = recorded_state(checkpoint)
    assert_bad_input(
        run_cli(*snapshot_cli(checkpoint), "--seed", "9"),
        str(checkpoint),
        "already has a manifest",
        "--force",
        no_stdout=True,
    )
    assert recorded_state(checkpoint) == before
    forced = run_cli(*snapshot_cli(checkpoint), "--seed", "9", "--force")
    assert forced.exit_code == 0, forced.output
    assert forced.stdout == f"{manifest_path_for(checkpoint)}\n"
    assert read_manifest(manifest_path_for(checkpoint)).predicate["seeds"] == (9,)


def test_a_pickle_checkpoint_is_said_to_be_covered_by_its_file_digest_only(
    project: Project, key: SigningKey
) -> None:
    blob = project.root / "ck" / "model.pt"
    blob.parent.mkdir()
    blob.write_bytes(b"weights" * 1000)
    h5 = write_checkpoint(project.root / "ck" / "state.h5")
    done = snapshot([h5, blob], run="r", step=0)
    assert [m.path for m in done] == [manifest_path_for(h5), manifest_path_for(blob)]
    assert done.notes == (f"{blob}: {PICKLE_NOTE}",)
    assert snapshot(write_checkpoint(project.root / "ck" / "other.h5"), run="r", step=0).notes == ()


def test_the_cli_notes_a_pickle_checkpoint_on_stderr(project: Project, key: SigningKey) -> None:
    blob = project.root / "ck" / "model.pt"
    blob.parent.mkdir()
    blob.write_bytes(b"weights" * 1000)
    result = run_cli(*snapshot_cli(blob, 0))
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{manifest_path_for(blob)}\n"  # the result alone
    assert result.stderr == f"kaudit: note: {blob}: {PICKLE_NOTE}\n"
    quiet = run_cli("-q", *snapshot_cli(blob, 0), "--force")
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stderr == ""


def test_extending_a_run_takes_its_writer_lock_and_its_newest_manifest_only(
    project: Project, key: SigningKey
) -> None:
    root = project.root / "checkpoints"
    with ka.Run("r", root=root, seed=1, every=ka.EverySteps(1)) as run:
        for step in run.steps(3):
            run.checkpoint(step, {"u": np.full(4, float(step))})
    run_dir = root / "r"
    newest = run_dir / "step-00000003.h5.kaudit.json"
    extra = write_checkpoint(run_dir / "step-00000004.h5", seed=4)
    # While a Run writes the run, a snapshot extending its chain is a second writer.
    with ka.Run("r", root=root, seed=1, every=ka.EverySteps(1)), pytest.raises(RunLocked):
        snapshot(extra, run="r", step=4, parent=newest)
    # An older step as the parent would give it a second child: the chain would fork.
    with pytest.raises(UsageError, match="step 2 would get a second child") as forked:
        snapshot(extra, run="r", step=4, parent=run_dir / "step-00000002.h5.kaudit.json")
    assert forked.value.exit_code == 2
    assert not (run_dir / "step-00000004.h5.kaudit.json").exists()
    (m,) = snapshot(extra, run="r", step=4, parent=newest)
    assert m.parent == hashlib.sha256(newest.read_bytes()).hexdigest()
    done = run_cli("verify", str(run_dir), "--allow-unanchored", cwd=project.root)
    assert done.exit_code == 0, done.output


@pytest.mark.parametrize(
    ("free_pages", "failing"), [(0, ".gitignore"), (1, "step-00000001.h5.dvc")]
)
def test_a_full_disk_names_the_file_and_what_was_being_done(
    project: Project,
    key: SigningKey,
    tmpfs: Callable[..., Tmpfs],
    free_pages: int,
    failing: str,
) -> None:
    # The run's directory on a disk of its own, full but for ``free_pages`` pages: each
    # file snapshot writes there (git-ignore entry, .dvc file, manifest) takes one.
    run_dir = project.root / "checkpoints" / "r"
    disk = tmpfs(run_dir, 64 * 4096)
    ckpt = write_checkpoint(run_dir / "step-00000001.h5", 1, n=8)
    free = os.statvfs(run_dir).f_bavail * 4096
    filler = disk.where / "filler"
    filler.write_bytes(bytes(free - free_pages * 4096))
    before = sorted(p.name for p in run_dir.iterdir())

    line = assert_bad_input(
        run_cli("snapshot", str(ckpt), "--run", "r", "--step", "1", cwd=project.root),
        f"{failing}: cannot write: No space left on device",
    )
    assert str(run_dir) in line or "checkpoints/r/" in line
    assert not (run_dir / "step-00000001.h5.kaudit.json").exists()  # never signed
    assert {p.name for p in run_dir.iterdir()} - set(before) <= {".gitignore"}  # no temporary
    filler.unlink()
