"""A campaign's records tracked by DVC and pushed with its steps: an auditor with the
certificate and the remote, but not the records, gets them from the remote through
``kaudit verify``, each file accepted only as the sha256 the certificate signs. Tried as
an attacker would: an object swapped in the remote, a listing naming a path outside the
records' directory."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.project.repository import Project
from kronos_audit.statement.campaign import read_certificate
from kronos_audit.statement.records import records_dir
from kronos_audit.storage import dvc_file_for
from kronos_audit.storage.directories import read_directory_dvc_file, write_directory_dvc_file
from kronos_audit.storage.fetch import RemoteSource
from tests.helpers import run_cli

N = 600
"""Batches: three chunks and their index."""


def trivial(rng: np.random.Generator) -> np.float64:
    return np.float64(rng.random())


def verify(project: Project, cert: Path, *args: str) -> tuple[int, str]:
    done = run_cli("verify", *args, str(cert), cwd=project.root)
    return done.exit_code, done.output


def test_pushed_records_are_fetched_checked_and_never_taken_from_a_hostile_remote(
    project: Project, key: ka.SigningKey, remote: Path
) -> None:
    root = project.root / "checkpoints"
    with ka.Run("mc", root=root, seed=5, every=ka.EverySteps(N // 2), push=True) as run:
        run.map_batches(trivial, N)
    cert = root / "mc.campaign.json"
    directory = records_dir(cert, "mc")
    names = sorted(p.name for p in directory.iterdir())
    assert len(names) == 4
    listing = read_directory_dvc_file(dvc_file_for(directory))
    assert listing is not None
    assert listing[2] == 4
    pushed = {p.name for p in (remote / "files" / "md5").rglob("*") if p.is_file()}
    for name in names:  # every file in the remote under its md5, and the listing
        md5 = hashlib.md5((directory / name).read_bytes(), usedforsecurity=False).hexdigest()
        assert md5[2:] in pushed
    assert listing[0][2:] + ".dir" in pushed
    assert f"/{directory.name}" in (root / ".gitignore").read_text()

    # An auditor's clone: the certificate and its .dvc file, not the records.
    shutil.rmtree(directory)
    code, out = verify(project, cert, "--no-fetch")
    assert code == 1, out
    code, out = verify(project, cert)
    assert code == 0, out
    assert sorted(p.name for p in directory.iterdir()) == names

    # The remote's object of one chunk swapped for another chunk's: refused, naming it.
    record = read_certificate(cert).record
    assert record.records is not None
    chunk = next(n for n in names if n != record.records.index)
    other = next(n for n in names if n not in (chunk, record.records.index))
    md5 = hashlib.md5((directory / chunk).read_bytes(), usedforsecurity=False).hexdigest()
    obj = remote / "files" / "md5" / md5[:2] / md5[2:]
    obj.chmod(0o644)
    obj.write_bytes((directory / other).read_bytes())
    (directory / chunk).unlink()
    code, out = verify(project, cert)
    assert code == 1, out
    assert f"mc.records/{chunk}: the DVC remote's object {md5} is not of that md5" in out
    assert not (directory / chunk).exists()  # nothing written
    assert not [p for p in directory.iterdir() if p.name.startswith(".")]

    # A listing that gives the chunk another object's md5 (a real one): its sha256 is not
    # the signed one, whatever the listing says.
    other_md5 = hashlib.md5((directory / other).read_bytes(), usedforsecurity=False).hexdigest()
    hostile_listing(remote, directory, [{"md5": other_md5, "relpath": chunk}])
    code, out = verify(project, cert)
    assert code == 1, out
    assert f"mc.records/{chunk}: the DVC remote's object {other_md5} is not the file" in out
    assert not (directory / chunk).exists()

    # A listing naming a file outside the directory: refused, nothing fetched.
    hostile_listing(remote, directory, [{"md5": other_md5, "relpath": "../outside"}])
    code, out = verify(project, cert)
    assert code == 1, out
    assert "its DVC listing names '../outside', not a file of mc.records/" in out
    assert not (root / "outside").exists()
    assert len(out.splitlines()) == 4  # the verdict, the one line, the signer, the sum


def hostile_listing(remote: Path, directory: Path, entries: list[dict[str, str]]) -> None:
    """What anyone may write: a listing in the remote, under its own md5, and the
    ``.dvc`` file naming it."""
    data = json.dumps(entries).encode()
    md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
    put = remote / "files" / "md5" / md5[:2] / (md5[2:] + ".dir")
    put.parent.mkdir(parents=True, exist_ok=True)
    put.write_bytes(data)
    write_directory_dvc_file(directory, md5, 1, len(entries))


def test_a_records_directory_swapped_for_a_link_mid_fetch_is_not_written_through(
    project: Project,
    key: ka.SigningKey,
    remote: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = project.root / "checkpoints"
    with ka.Run("mc", root=root, seed=5, every=ka.EverySteps(N), push=True) as run:
        run.map_batches(trivial, N)
    cert = root / "mc.campaign.json"
    directory = records_dir(cert, "mc")
    for p in directory.iterdir():  # an auditor's empty records directory
        p.unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = tmp_path / "moved"
    read = RemoteSource.read_bounded

    def swapping(self: RemoteSource, oid: str, where: Path, limit: int) -> bytes:
        # The attacker's moment: the directory opened, its first file on its way.
        if not directory.is_symlink():
            directory.rename(moved)
            directory.symlink_to(elsewhere)
        return read(self, oid, where, limit)

    monkeypatch.setattr(RemoteSource, "read_bounded", swapping)
    code, out = verify(project, cert)
    assert code == 1, out
    assert "mc.records: a symbolic link, not followed" in out
    assert list(elsewhere.iterdir()) == []  # nothing written where the link points
    records = read_certificate(cert).record.records
    assert records is not None
    assert [p.name for p in moved.iterdir()] == [records.index]  # through the handle


def array_task(project: Project, k: int, tasks: int) -> None:
    env = {"SLURM_ARRAY_TASK_ID": str(k), "SLURM_ARRAY_TASK_COUNT": str(tasks)}
    root = project.root / "checkpoints"
    with ka.Run("arr", root=root, seed=5, task=ka.ArrayTask.from_slurm(env)) as run:
        run.map_batches(trivial, N)


def test_an_array_certificate_s_records_are_pushed_by_kaudit_push_and_kaudit_campaign(
    project: Project, key: ka.SigningKey, remote: Path
) -> None:
    for k in range(2):
        array_task(project, k, 2)
    certified = run_cli("campaign", "arr", "--certify", cwd=project.root)
    assert certified.exit_code == 0, certified.output
    cert = project.root / "checkpoints" / "arr.campaign.json"
    directory = records_dir(cert, "arr")
    objects = remote / "files" / "md5"

    def in_remote() -> set[str]:
        return {p.parent.name + p.name for p in objects.rglob("*") if p.is_file()}

    names = sorted(p.name for p in directory.iterdir())
    md5s = {md5_of(directory / n) for n in names}
    assert not md5s & in_remote()

    pushed = run_cli("push", str(cert), cwd=project.root)
    assert pushed.exit_code == 0, pushed.output
    assert f"pushed the records of checkpoints/arr.campaign.json: {len(names)} file(s)" in (
        pushed.stdout
    )
    assert md5s <= in_remote()
    assert dvc_file_for(directory).is_file()
    # The parts' index and chunk among them (a job array's certificate of the third
    # version): an auditor without the records fetches both kinds, each checked.
    parts = read_certificate(cert).record.part_records
    assert parts is not None
    assert parts.index in names
    shutil.rmtree(directory)
    fetched = run_cli("verify", str(cert), cwd=project.root)
    assert fetched.exit_code == 0, fetched.output
    assert sorted(p.name for p in directory.iterdir()) == names

    # Certified again with --push: the records tracked and pushed as a run that pushes does.
    again = run_cli("campaign", "arr", "--certify", "--push", cwd=project.root)
    assert again.exit_code == 0, again.output
    assert "its records pushed to the DVC remote" in again.stdout

    # A certificate no trusted key signed: nothing read, nothing pushed.
    envelope = json.loads(cert.read_text())
    envelope["signatures"][0]["sig"] = base64.b64encode(bytes(64)).decode()
    cert.write_text(json.dumps(envelope))
    refused = run_cli("push", str(cert), cwd=project.root)
    assert refused.exit_code == 1, refused.output
    assert "not pushed, its signature" in refused.stdout


def md5_of(path: Path) -> str:
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


def test_kaudit_push_of_a_certificate_that_is_not_one_is_bad_input(
    project: Project, key: ka.SigningKey, remote: Path
) -> None:
    cert = project.root / "checkpoints" / "arr.campaign.json"
    cert.parent.mkdir()
    cert.write_text("{}")
    result = run_cli("push", str(cert), cwd=project.root)
    assert result.exit_code == 2, result.output
    assert "arr.campaign.json" in result.stderr
