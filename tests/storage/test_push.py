"""Pushing what verified manifests sign, to where DVC's own configuration says, and
confirming it in the remote; repairing a damaged local copy (`kaudit pull --force`).
Real DVC, a real directory remote, real runs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.errors import PushIncomplete, StorageError
from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.storage import (
    Storage,
    cache_object_path,
    cache_settings,
    dvc_file_for,
    write_dvc_file,
)
from tests.helpers import discard, git, run_cli, signed_items, untrusted_key, write_checkpoint
from tests.threadranks import ThreadRanks, on_ranks, thread_run

pytestmark = pytest.mark.slow


def dvc(repo: Path, *args: str) -> None:
    """Real `dvc` (its config command): the global level goes to the test's own
    DVC_GLOBAL_CONFIG_DIR (tests/conftest.py)."""
    subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, check=True, capture_output=True)


def heat_run(project: Project, steps: int = 20, *, push: bool = False) -> ka.Run:
    with ka.Run(
        "heat", root=project.root / "checkpoints", seed=5, every=ka.EverySteps(10), push=push
    ) as run:
        state = {"u": run.rng.random((64, 64))}
        for step in run.steps(steps):
            state = {"u": 0.5 * state["u"] + 0.5 * run.rng.random((64, 64))}
            run.checkpoint(step, state)
    return run


@pytest.fixture
def anchor(key: SigningKey, tmp_path: Path) -> str:
    """The run's public key as a file given on the command line: an explicit anchor."""
    path = tmp_path / "tester.pub"
    path.write_bytes(public_pem(key.private_key.public_key()))
    return str(path)


def remote_object(remote: Path, md5: str) -> Path:
    return remote / "files" / "md5" / md5[:2] / md5[2:]


def md5_of(checkpoint: Path) -> str:
    md5 = ka.read_manifest(Path(str(checkpoint) + ".kaudit.json")).subject_md5
    assert md5 is not None
    return md5


RUN = Path("checkpoints") / "heat"
STEP_10 = RUN / "step-00000010.h5"
STEP_20 = RUN / "step-00000020.h5"


# -- which cache: DVC's own configuration, every level ----------------------------------


def test_a_global_cache_dir_is_where_a_run_puts_its_objects_and_push_uploads_them(
    project: Project, key: SigningKey, remote: Path, anchor: str, tmp_path: Path
) -> None:
    shared = tmp_path / "scratch" / "dvc-cache"
    dvc(project.root, "config", "--global", "cache.dir", str(shared))
    heat_run(project)
    ckpt = project.root / STEP_10
    md5 = md5_of(ckpt)
    assert cache_object_path(shared, md5).exists()  # where DVC itself looks
    assert not cache_object_path(project.root / ".dvc" / "cache", md5).exists()

    result = run_cli("push", str(project.root / RUN), "--trusted-key", anchor)
    assert result.exit_code == 0, result.output
    assert "2 object(s) uploaded" in result.stdout
    for c in (ckpt, project.root / STEP_20):
        assert remote_object(remote, md5_of(c)).read_bytes() == c.read_bytes()


def test_a_run_that_pushes_uploads_from_a_global_cache_dir(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    # Relative on dvc's command line (to where it runs); DVC writes it relative to the
    # global file's directory and resolves it back: kaudit takes DVC's resolution.
    dvc(project.root, "config", "--global", "cache.dir", "../scratch-cache")
    shared = tmp_path / "scratch-cache"
    assert cache_settings(project)[0] == shared
    run = heat_run(project, push=True)
    assert run.push_failures == []
    for c in (project.root / STEP_10, project.root / STEP_20):
        assert cache_object_path(shared, md5_of(c)).exists()
        assert remote_object(remote, md5_of(c)).read_bytes() == c.read_bytes()


def test_a_tracked_cache_dir_outside_the_repository_is_refused_until_accepted_locally(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "attacker-chosen"
    # What a commit can carry: the repository level, .dvc/config, tracked by git.
    dvc(project.root, "config", "cache.dir", str(elsewhere))
    with pytest.raises(StorageError) as caught:
        heat_run(project)
    assert "comes from the tracked .dvc/config" in str(caught.value)
    assert f"dvc config --local cache.dir {elsewhere}" in str(caught.value)
    assert not elsewhere.exists()
    assert not list((project.root / "checkpoints").glob("*/step-*.h5"))

    # It also overrides a user's global choice (repo outranks global in DVC): still refused.
    dvc(project.root, "config", "--global", "cache.dir", str(tmp_path / "mine"))
    with pytest.raises(StorageError, match="comes from the tracked"):
        cache_settings(project)

    # Accepted for this machine, in the local (untracked) file: honoured.
    dvc(project.root, "config", "--local", "cache.dir", str(elsewhere))
    heat_run(project)
    assert cache_object_path(elsewhere, md5_of(project.root / STEP_10)).exists()


def test_a_tracked_cache_dir_inside_the_repository_and_the_tracked_link_types_are_honoured(
    project: Project, key: SigningKey, remote: Path
) -> None:
    dvc(project.root, "config", "cache.dir", "dvc-cache")  # the repository's own
    dvc(project.root, "config", "cache.type", "hardlink")  # what `kaudit init` writes, too
    cache_dir, types = cache_settings(project)
    assert cache_dir == (project.root / "dvc-cache").resolve()
    assert types == ("hardlink",)
    heat_run(project)
    ckpt = project.root / STEP_10
    obj = cache_object_path(cache_dir, md5_of(ckpt))
    assert os.stat(obj).st_ino == os.stat(ckpt).st_ino  # linked, as the tracked file asks


# -- push: confirmed in the remote, by the signed md5 and size --------------------------


def test_push_names_an_object_left_missing_and_exits_1(
    project: Project, key: SigningKey, remote: Path, anchor: str, caplog: pytest.LogCaptureFixture
) -> None:
    heat_run(project)
    ckpt = project.root / STEP_10
    md5 = md5_of(ckpt)
    cache_dir, _ = cache_settings(project)
    cache_object_path(cache_dir, md5).unlink()  # DVC has nothing to upload
    corrupt_in_place(ckpt)  # and the checkpoint here is not the signed bytes to put back
    result = run_cli("push", str(project.root / RUN), "--trusted-key", anchor)
    assert result.exit_code == 1, result.output
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("FAIL")]
    assert "step-00000010.h5" in line
    assert f"the object {md5} was not uploaded" in line
    assert "repaired" not in result.stdout
    assert not cache_object_path(cache_dir, md5).exists()  # nothing unverified went in
    # DVC's own warning is not swallowed (kaudit quiets only DVC's INFO chatter).
    assert any(
        r.name.startswith("dvc") and r.levelname == "WARNING" and "do not exist" in r.getMessage()
        for r in caplog.records
    )
    assert not remote_object(remote, md5).exists()
    assert remote_object(remote, md5_of(project.root / STEP_20)).exists()  # the other went
    # Its manifest stays here: a manifest in the remote without its data is no checkpoint.
    beside = remote / "kaudit" / "runs" / "heat"
    assert sorted(p.name for p in beside.iterdir()) == ["step-00000020.h5.kaudit.json"]

    with pytest.raises(PushIncomplete) as caught:
        Storage(project).push(signed_items([ckpt]))
    assert caught.value.exit_code == 1
    assert list(caught.value.missing) == [ckpt]


@pytest.mark.parametrize("cache_type", [None, "copy"], ids=["links", "copy"])
def test_a_lost_cache_object_is_put_back_by_push_from_the_verified_checkpoint(
    project: Project, key: SigningKey, remote: Path, anchor: str, cache_type: str | None
) -> None:
    """A signed checkpoint whose object DVC's cache lost: push hashes the checkpoint here,
    finds the signed bytes, puts them back into the cache, says so, and pushes them."""
    if cache_type is not None:
        dvc(project.root, "config", "--local", "cache.type", cache_type)
    heat_run(project)
    ckpt = project.root / STEP_10
    md5 = md5_of(ckpt)
    obj = cache_object_path(cache_settings(project)[0], md5)
    obj.unlink()
    result = run_cli("push", str(project.root / RUN), "--trusted-key", anchor)
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("repaired")]
    assert "step-00000010.h5" in line
    assert "verified against the signed size, sha256 and md5" in line
    assert obj.read_bytes() == ckpt.read_bytes()
    assert hashlib.md5(obj.read_bytes()).hexdigest() == md5
    assert obj.stat().st_mode & 0o222 == 0  # read-only, as DVC keeps its cache
    if cache_type == "copy":
        assert not os.path.samefile(obj, ckpt)
    assert remote_object(remote, md5).read_bytes() == ckpt.read_bytes()
    again = run_cli("push", str(project.root / RUN), "--trusted-key", anchor, "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["repaired"] == []


def test_push_without_a_remote_repairs_nothing(
    project: Project, key: SigningKey, anchor: str
) -> None:
    heat_run(project)
    obj = cache_object_path(cache_settings(project)[0], md5_of(project.root / STEP_10))
    obj.unlink()
    result = run_cli("push", str(project.root / RUN), "--trusted-key", anchor)
    assert result.exit_code == 2, result.output
    assert "no DVC remote" in result.output
    assert not obj.exists()  # nothing changed here


def test_push_puts_back_nothing_through_a_symbolic_link(
    project: Project, key: SigningKey, remote: Path, anchor: str, tmp_path: Path
) -> None:
    """The checkpoint swapped for a symbolic link to the signed bytes elsewhere: a link is
    never followed into DVC's cache, even to the right bytes; the push names it missing."""
    heat_run(project)
    ckpt = project.root / STEP_10
    md5 = md5_of(ckpt)
    obj = cache_object_path(cache_settings(project)[0], md5)
    obj.unlink()
    elsewhere = tmp_path / "elsewhere.h5"
    elsewhere.write_bytes(ckpt.read_bytes())
    ckpt.unlink()
    ckpt.symlink_to(elsewhere)
    result = run_cli("push", str(project.root / RUN), "--trusted-key", anchor)
    assert result.exit_code == 1, result.output
    assert "repaired" not in result.stdout
    assert f"the object {md5} was not uploaded" in result.stdout
    assert not obj.exists()
    assert not remote_object(remote, md5).exists()


def test_a_sharded_step_signed_before_it_was_tracked_is_repaired_by_push(
    project: Project, key: SigningKey, remote: Path, anchor: str, tmp_path: Path
) -> None:
    """What a kill between a step manifest's rename and the tracking of its index left
    (as kaudit once committed): the index signed, but neither in DVC's cache nor named by
    a .dvc file; and a shard's cache object lost. status says local; push puts each back
    from the verified bytes here, says so, and pushes the step."""

    def ranks(comm: ThreadRanks) -> None:
        with thread_run(project.root, "heat", comm) as run:
            for step in run.steps(2):
                u = np.arange(16.0).reshape(4, 4) + step + 100 * comm.rank
                run.checkpoint(step, {"u": u}, layout={"u": ka.Block(axis=0)})

    on_ranks(2, ranks)
    step = project.root / RUN / "step-00000001"
    cache_dir, _ = cache_settings(project)
    index, shard = step / "index.jsonl", step / "rank-000001-of-000002.h5"
    lost = {p: hashlib.md5(p.read_bytes()).hexdigest() for p in (index, shard)}
    for md5 in lost.values():
        cache_object_path(cache_dir, md5).unlink()
    dvc_file_for(index).unlink()
    first = run_cli("push", str(project.root / RUN), "--trusted-key", anchor, "--json")
    assert first.exit_code == 0, first.output
    repaired = json.loads(first.stdout)["repaired"]
    assert sorted(r["path"] for r in repaired) == sorted(
        project.relative(p) for p in (index, shard)
    )
    for path, md5 in lost.items():
        assert cache_object_path(cache_dir, md5).read_bytes() == path.read_bytes()
        assert remote_object(remote, md5).read_bytes() == path.read_bytes()
    assert dvc_file_for(index).read_text() == (
        f"outs:\n- md5: {lost[index]}\n  size: {index.stat().st_size}\n  hash: md5\n"
        "  path: index.jsonl\n"
    )
    status = run_cli("status", str(project.root / RUN), "--json")
    assert status.exit_code == 0, status.output
    assert {e["location"] for e in json.loads(status.stdout)["checkpoints"]} == {"pushed"}
    again = run_cli("push", str(project.root / RUN), "--trusted-key", anchor)
    assert again.exit_code == 0, again.output
    assert "repaired" not in again.stdout
    # A fresh clone verifies it from the remote, as the DVC files in git say.
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "the run")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    checked = run_cli("verify", str(clone / RUN), "--trusted-key", anchor, cwd=clone)
    assert checked.exit_code == 0, checked.output
    assert "fetched" in checked.stdout


def test_a_damaged_cache_object_is_not_what_a_later_run_pushes(
    project: Project, key: SigningKey, remote: Path
) -> None:
    def still(name: str, *, push: bool) -> ka.Run:
        root = project.root / "checkpoints"
        with ka.Run(name, root=root, seed=1, every=ka.EverySteps(1), push=push) as run:
            for step in run.steps(1):
                run.checkpoint(step, {"x": np.zeros(100)})
        return run

    still("first", push=False)
    first = project.root / "checkpoints" / "first" / "step-00000001.h5"
    md5 = md5_of(first)
    # DVC's cache object damaged in place (it is the checkpoint's inode), then a second
    # run writes the same bytes: the object under their md5 is replaced by the bytes the
    # second run just wrote and hashed, and those are what reach the remote.
    corrupt_in_place(first)
    run = still("second", push=True)
    second = project.root / "checkpoints" / "second" / "step-00000001.h5"
    assert md5_of(second) == md5
    assert run.push_failures == []
    assert remote_object(remote, md5).read_bytes() == second.read_bytes()
    assert hashlib.md5(second.read_bytes()).hexdigest() == md5
    # The first run's damaged file is its own now, and fails its check where it is.
    (result,) = ka.verify(Path(str(first) + ".kaudit.json"), fetch=False)
    assert not result.ok


def test_an_edited_dvc_file_never_costs_another_checkpoints_remote_copy(
    project: Project, key: SigningKey, remote: Path, anchor: str
) -> None:
    heat_run(project)
    a, b = project.root / STEP_10, project.root / STEP_20
    b_bytes = b.read_bytes()
    assert run_cli("push", str(project.root / RUN), "--trusted-key", anchor).exit_code == 0
    # b now lives in the remote only.
    discard(Storage(project), b)
    # a's .dvc file edited to b's md5 with another size: a push that trusted it would
    # take b's remote object for a short push of a, and delete it.
    write_dvc_file(a, md5_of(b), a.stat().st_size + 1)

    result = run_cli("push", str(project.root / RUN), "--trusted-key", anchor)
    assert result.exit_code == 0, result.output
    assert remote_object(remote, md5_of(b)).read_bytes() == b_bytes  # survived
    assert remote_object(remote, md5_of(a)).read_bytes() == a.read_bytes()  # a's own data
    assert "pushed 1 checkpoint(s)" in result.stdout
    assert "1 not here" in result.stdout  # b: its manifest only


def test_a_remote_object_of_another_size_is_replaced_only_by_verified_local_bytes(
    project: Project, key: SigningKey, remote: Path
) -> None:
    heat_run(project)
    ckpt = project.root / STEP_10
    item = signed_items([ckpt])[0]
    Storage(project).push([item])
    obj = remote_object(remote, item.md5)
    good = obj.read_bytes()
    os.chmod(obj, 0o644)
    obj.write_bytes(good[:1000])  # a push killed midway
    # The local cache object damaged too: nothing verified to replace the remote's with.
    cache_obj = cache_object_path(cache_settings(project)[0], item.md5)
    os.chmod(cache_obj, 0o644)
    with open(cache_obj, "r+b") as f:
        f.seek(-100, os.SEEK_END)
        f.write(b"\0" * 100)
    with pytest.raises(PushIncomplete, match="left as it is"):
        Storage(project).push([item])
    assert obj.read_bytes() == good[:1000]  # not deleted for bytes that are not the signed ones

    # Once the local bytes are the signed ones again, the short object is replaced.
    with open(cache_obj, "r+b") as f:
        f.seek(-100, os.SEEK_END)
        f.write(good[-100:])
    assert Storage(project).push([item]) == 1
    assert obj.read_bytes() == good


def test_a_manifest_that_does_not_verify_is_not_pushed(
    project: Project, key: SigningKey, remote: Path, anchor: str
) -> None:
    # Signed by a key no anchor holds (neither the user's store nor the key given).
    mallory = untrusted_key("mallory")
    with ka.Run(
        "heat", root=project.root / "checkpoints", seed=5, every=ka.EverySteps(10), key=mallory
    ) as run:
        for step in run.steps(20):
            run.checkpoint(step, {"u": np.full(64, float(step))})
    result = run_cli("push", str(project.root / RUN), "--trusted-key", anchor)
    assert result.exit_code == 1, result.output
    fails = [x for x in result.stdout.splitlines() if x.startswith("FAIL")]
    assert len(fails) == 2
    assert all("not pushed, the manifest does not verify (signature" in x for x in fails)
    assert not (remote / "files").exists()
    assert not (remote / "kaudit").exists()


# -- repair: pull --force ---------------------------------------------------------------


def corrupt_in_place(path: Path) -> None:
    os.chmod(path, 0o644)  # a hard link shares the mode: the other names see it too
    with open(path, "r+b") as f:
        f.seek(-64, os.SEEK_END)
        f.write(b"\xff" * 64)


def test_pull_leaves_a_damaged_copy_and_force_replaces_it_from_the_remote(
    project: Project, key: SigningKey, remote: Path, anchor: str
) -> None:
    heat_run(project)
    run_dir = project.root / RUN
    a, b = project.root / STEP_10, project.root / STEP_20
    good = a.read_bytes()
    b_before = (b.read_bytes(), os.stat(b).st_ino)
    assert run_cli("push", str(run_dir), "--trusted-key", anchor).exit_code == 0
    corrupt_in_place(a)  # a shares its inode with DVC's cache object: both damaged
    damaged = a.read_bytes()

    pulled = run_cli("pull", str(run_dir), "--trusted-key", anchor)
    assert pulled.exit_code == 1, pulled.output
    fails = [x for x in pulled.stdout.splitlines() if x.startswith("FAIL")]
    assert fails
    assert all("step-00000010.h5" in x and "--force" in x for x in fails)
    assert a.read_bytes() == damaged  # left as it is

    forced = run_cli("pull", str(run_dir), "--force", "--trusted-key", anchor)
    assert forced.exit_code == 0, forced.output
    assert "step-00000010.h5 (replaced by the verified remote copy)" in forced.stdout
    assert a.read_bytes() == good
    assert hashlib.md5(good).hexdigest() == md5_of(a)
    cache_obj = cache_object_path(cache_settings(project)[0], md5_of(a))
    assert cache_obj.read_bytes() == good  # the damaged object went; a good one is there
    assert (b.read_bytes(), os.stat(b).st_ino) == b_before
    assert not list(run_dir.glob(".kaudit-tmp-*"))
    assert run_cli("verify", str(run_dir), "--trusted-key", anchor).exit_code == 0


def test_force_never_writes_into_a_cache_object_another_checkpoint_shares(
    project: Project, key: SigningKey, remote: Path, anchor: str
) -> None:
    # A state that does not change: byte-identical checkpoints, one md5, one cache object.
    with ka.Run("still", root=project.root / "checkpoints", seed=1, every=ka.EverySteps(1)) as run:
        for step in run.steps(2):
            run.checkpoint(step, {"x": np.zeros(100)})
    run_dir = project.root / "checkpoints" / "still"
    one, two = run_dir / "step-00000001.h5", run_dir / "step-00000002.h5"
    assert md5_of(one) == md5_of(two)
    good = one.read_bytes()
    assert run_cli("push", str(run_dir), "--trusted-key", anchor).exit_code == 0
    # Both brought back from DVC's cache: each a hard link to the one object.
    for ckpt in (one, two):
        ckpt.unlink()
        assert run_cli("pull", str(ckpt) + ".kaudit.json", "--trusted-key", anchor).exit_code == 0
    cache_obj = cache_object_path(cache_settings(project)[0], md5_of(one))
    assert os.stat(one).st_ino == os.stat(two).st_ino == os.stat(cache_obj).st_ino

    corrupt_in_place(one)  # the shared inode: all three names show the damage
    shared = os.stat(two).st_ino
    damaged = two.read_bytes()
    pulled = run_cli("pull", str(one) + ".kaudit.json", "--trusted-key", anchor)
    assert pulled.exit_code == 1, pulled.output
    assert "--force" in pulled.stdout

    forced = run_cli("pull", str(one) + ".kaudit.json", "--force", "--trusted-key", anchor)
    assert forced.exit_code == 0, forced.output
    assert one.read_bytes() == good
    assert os.stat(one).st_ino != shared  # a new file under the name, not a repaired inode
    # The other checkpoint is untouched: the same inode, its bytes as they were.
    assert (os.stat(two).st_ino, two.read_bytes()) == (shared, damaged)
    assert cache_obj.read_bytes() == good  # the damaged object was unlinked, not written
    assert os.stat(cache_obj).st_ino != shared

    # And it is repaired in its turn, the same way.
    again = run_cli("pull", str(two) + ".kaudit.json", "--force", "--trusted-key", anchor)
    assert again.exit_code == 0, again.output
    assert two.read_bytes() == good
    assert dvc_file_for(two).exists()


def test_a_planted_cache_object_is_replaced_by_the_signed_bytes_not_pushed(
    project: Project, key: SigningKey, remote: Path, anchor: str
) -> None:
    ckpt = write_checkpoint(project.root / "data" / "step-00000001.h5", seed=3)
    data = ckpt.read_bytes()
    md5 = hashlib.md5(data).hexdigest()
    # Someone put other bytes of the same size into DVC's cache under the md5 this file
    # will be tracked by (a corrupt object, or a planted one).
    cache_dir, _ = cache_settings(project)
    planted = cache_object_path(cache_dir, md5)
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(bytes(len(data)))
    planted.chmod(0o444)
    done = run_cli("snapshot", str(ckpt), "--run", "r", "--step", "1", cwd=project.root)
    assert done.exit_code == 0, done.output
    assert planted.read_bytes() == data  # the signed bytes, not what was there
    pushed = run_cli("push", str(ckpt.parent), "--trusted-key", anchor, cwd=project.root)
    assert pushed.exit_code == 0, pushed.output
    assert remote_object(remote, md5).read_bytes() == data
    assert ckpt.read_bytes() == data  # the user's file untouched
