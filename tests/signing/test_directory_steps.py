"""Directory steps: another tool's checkpoint directory signed as one step, from beside it
(kronos_audit.checkpoint.directory, kronos_audit.signing.snapshot)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.directory import FileEntry, dvc_listing
from kronos_audit.checkpoint.layout import manifest_path_for
from kronos_audit.errors import CheckpointError, ManifestError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.sign import sign_directory_step
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.storage import cache_settings, dvc_file_for
from kronos_audit.storage.directories import listing_object_path, read_directory_dvc_file
from kronos_audit.verification.batch import verify
from tests.helpers import KAUDIT, assert_bad_input, git, run_cli, write_checkpoint


def dcp_like(directory: Path, seed: int = 0) -> Path:
    """A directory as a tool writes one: a dot-file, a data file, and (for depth) a
    subdirectory holding an HDF5 file."""
    (directory / "extra").mkdir(parents=True)
    (directory / ".tool_state").write_bytes(b"state %d" % seed)
    (directory / "__0_0.distcp").write_bytes(bytes(range(256)) * (4 + seed))
    write_checkpoint(directory / "extra" / "state.h5", seed=seed, n=8)
    return directory


def tree(directory: Path) -> list[tuple[str, bytes]]:
    return sorted(
        (p.relative_to(directory).as_posix(), p.read_bytes())
        for p in directory.rglob("*")
        if p.is_file()
    )


def test_a_directory_is_signed_as_one_step_from_beside_it(
    project: Project, key: SigningKey
) -> None:
    step = dcp_like(project.root / "ckpt" / "step-3")
    before = tree(step)
    (m,) = ka.snapshot(step, run="dcp", step=3)
    # One manifest beside the directory; nothing written inside the tool's tree.
    assert m.path == manifest_path_for(step) == project.root / "ckpt" / "step-3.kaudit.json"
    assert tree(step) == before
    record = m.record.directory
    assert record is not None
    assert [f.path for f in record.files] == [".tool_state", "__0_0.distcp", "extra/state.h5"]
    assert m.datasets is None  # no tensors spanning files: not a DCP directory
    for f in record.files:
        data = (step / f.path).read_bytes()
        assert (f.size, f.sha256, f.md5) == (
            len(data),
            hashlib.sha256(data).hexdigest(),
            hashlib.md5(data).hexdigest(),
        )
    assert record.count == 3
    assert record.bytes == m.record.size == sum(len(b) for _, b in before)
    # The HDF5 file inside keeps its per-dataset digests; the others only their file's.
    by_path = {f.path: f for f in record.files}
    assert by_path[".tool_state"].datasets is None
    h5 = by_path["extra/state.h5"].datasets
    assert h5 is not None
    assert "/fields/u" in {d.path for d in h5}
    # The subject is the file index: one canonical line per file.
    index = b"".join(
        json.dumps(f.record(), sort_keys=True, separators=(",", ":")).encode() + b"\n"
        for f in record.files
    )
    assert m.subject_sha256 == hashlib.sha256(index).hexdigest()
    assert m.subject_name == "ckpt/step-3"
    # DVC: one directory output, its listing in the cache, as `dvc add` would leave it.
    md5, size, nfiles = read_directory_dvc_file(dvc_file_for(step)) or ("", 0, 0)
    assert (size, nfiles) == (record.bytes, 3)
    assert md5 == m.subject_md5
    cache_dir, _ = cache_settings(project)
    listing = listing_object_path(cache_dir, md5).read_bytes()
    assert hashlib.md5(listing).hexdigest() == md5
    assert [e["relpath"] for e in json.loads(listing)] == [f.path for f in record.files]
    assert (project.root / "ckpt" / ".gitignore").read_text() == "/step-3\n"
    # DVC itself finds the directory output as it tracks it: unchanged.
    status = subprocess.run(
        [str(Path(KAUDIT[0]).parent / "dvc"), "status", "--json", str(dvc_file_for(step))],
        cwd=project.root,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(status.stdout) == {}
    (result,) = verify(m.path)
    assert result.ok, result.failures
    shown = run_cli("show", str(m.path))
    assert shown.exit_code == 0, shown.output
    assert "directory    3 files" in shown.output
    assert "a directory step of 3 files" in shown.output
    assert ".tool_state" in shown.output
    assert "not HDF5" not in shown.output


def test_verify_names_each_file_added_missing_or_changed(project: Project, key: SigningKey) -> None:
    step = dcp_like(project.root / "ckpt" / "step-3")
    ka.snapshot(step, run="dcp", step=3)
    (step / ".tool_state").unlink()
    (step / "extra" / "new.bin").write_bytes(b"new")
    shard = step / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[7] ^= 1
    shard.unlink()  # a new file, as a writer that replaces its output leaves it
    shard.write_bytes(bytes(data))
    done = run_cli("verify", str(step))
    assert done.exit_code == 1, done.output
    lines = done.output.splitlines()
    assert any("files: missing: .tool_state" in line for line in lines), done.output
    assert any("files: added: extra/new.bin" in line for line in lines), done.output
    assert any("files: changed: __0_0.distcp (sha256" in line for line in lines), done.output
    # By its manifest too, and a size change is named without hashing.
    shard.unlink()
    shard.write_bytes(b"short")
    done = run_cli("verify", str(manifest_path_for(step)))
    assert done.exit_code == 1
    assert "changed: __0_0.distcp (is 5 bytes, the manifest records 1,024" in done.output


def test_links_and_special_files_are_refused_at_snapshot_and_at_verify(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the remote")
    step = dcp_like(project.root / "ckpt" / "step-3")
    os.symlink(secret, step / "out.bin")
    assert_bad_input(
        run_cli("snapshot", str(step), "--run", "r", "--step", "3"),
        "out.bin: is a symbolic link",
    )
    assert not manifest_path_for(step).exists()
    assert not dvc_file_for(step).exists()
    (step / "out.bin").unlink()
    os.link(step / ".tool_state", step / "twin")  # a hard link inside the step
    with pytest.raises(CheckpointError, match=r"twin: is a hard link to \.tool_state"):
        ka.snapshot(step, run="r", step=3)
    (step / "twin").unlink()
    os.symlink(step / "extra", step / "inner")  # a link to a directory inside it
    with pytest.raises(CheckpointError, match="inner: is a symbolic link"):
        ka.snapshot(step, run="r", step=3)
    (step / "inner").unlink()
    os.mkfifo(step / "extra" / "pipe")  # never opened: a FIFO would block the read
    with pytest.raises(CheckpointError, match="extra/pipe: is a FIFO, not a regular file"):
        ka.snapshot(step, run="r", step=3)
    (step / "extra" / "pipe").unlink()
    outside = project.root / "elsewhere"
    dcp_like(outside)
    os.symlink(outside, project.root / "ckpt" / "step-4")
    with pytest.raises(CheckpointError, match="is a symbolic link"):
        ka.snapshot(project.root / "ckpt" / "step-4", run="r", step=4)
    (m,) = ka.snapshot(step, run="r", step=3)
    # After signing: a FIFO and a link out are named by verify, never waited on or read.
    os.mkfifo(step / "extra" / "pipe")
    os.symlink(secret, step / "extra" / "state.h5.link")
    done = subprocess.run(
        [*KAUDIT, "verify", str(step)],
        cwd=project.root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "extra/pipe: is a FIFO, not a regular file" in done.stdout
    assert "extra/state.h5.link: is a symbolic link" in done.stdout
    # A file replaced by a link to itself elsewhere: refused, not followed.
    (step / "extra" / "pipe").unlink()
    (step / "extra" / "state.h5.link").unlink()
    moved = tmp_path / "state.h5"
    (step / "extra" / "state.h5").rename(moved)
    os.symlink(moved, step / "extra" / "state.h5")
    (result,) = verify(m.path)
    assert not result.ok
    assert [c.detail for c in result.failures] == [
        "extra/state.h5: is a symbolic link: a step holds regular files only",
        "missing: extra/state.h5",
    ]


def test_a_listing_that_leaves_its_directory_is_no_manifest(
    project: Project, key: SigningKey
) -> None:
    step = dcp_like(project.root / "ckpt" / "step-3")
    data = b"x"
    digest = hashlib.sha256(data).hexdigest()
    md5 = hashlib.md5(data).hexdigest()
    for bad, why in [
        ("../escape", "not a plain relative path"),
        ("/etc/passwd", "not a relative path"),
        ("a//b", "not a plain relative path"),
    ]:
        with pytest.raises(ManifestError, match=why):
            sign_directory_step(
                step,
                [FileEntry(bad, 1, digest, md5)],
                project=project,
                key=key,
                run="r",
                step=3,
                write=False,
            )
    with pytest.raises(ManifestError, match="out of path order or listed twice"):
        sign_directory_step(
            step,
            [FileEntry("b", 1, digest, md5), FileEntry("a", 1, digest, md5)],
            project=project,
            key=key,
            run="r",
            step=3,
            write=False,
        )
    assert not manifest_path_for(step).exists()
    # The listing DVC reads is DVC's own encoding of the signed files.
    files = [FileEntry("b", 1, digest, md5), FileEntry("a/c", 1, digest, md5)]
    assert json.loads(dvc_listing(files)) == [
        {"md5": md5, "relpath": "a/c"},
        {"md5": md5, "relpath": "b"},
    ]


def test_directory_steps_chain_and_log_shows_them(project: Project, key: SigningKey) -> None:
    first = dcp_like(project.root / "ckpt" / "step-1", seed=1)
    second = dcp_like(project.root / "ckpt" / "step-2", seed=2)
    (m1,) = ka.snapshot(first, run="dcp", step=1)
    done = run_cli("snapshot", str(second), "--run", "dcp", "--step", "2", "--parent", str(m1.path))
    assert done.exit_code == 0, done.output
    m2 = read_manifest(manifest_path_for(second))
    assert m2.parent == m1.digest
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "steps")
    results = verify([m2.path])
    assert all(r.ok for r in results), [r.failures for r in results]
    log = run_cli("log", str(project.root / "ckpt"))
    assert log.exit_code == 0, log.output
    assert "run dcp" in log.output
    assert "checkpoints 2 (steps 1..2), newest step 2" in log.output
    assert "data        2 local" in log.output
    report = run_cli("report", str(project.root / "ckpt"), "--out", str(project.root / "r.md"))
    assert report.exit_code == 0, report.output
    text = (project.root / "r.md").read_text()
    assert "# kaudit report: PASS" in text
    assert "ckpt/step-2.kaudit.json" in text
    diff = run_cli("diff", str(first), str(second))
    assert diff.exit_code == 1, diff.output
    assert "__0_0.distcp" in diff.output
    assert ".tool_state" in diff.output
    assert "extra/state.h5" in diff.output
    # what is compared is what verifies: a step whose signature does not hold is refused
    envelope = json.loads(m2.path.read_text())
    envelope["signatures"][0]["sig"] = "A" * len(envelope["signatures"][0]["sig"])
    m2.path.write_text(json.dumps(envelope))
    line = assert_bad_input(run_cli("diff", str(first), str(second)), "does not verify")
    assert "step-2.kaudit.json" in line
