"""A directory step in DVC: pushed file by file with its listing, restored by a plain
`dvc pull` in a fresh clone, fetched by `kaudit pull` by the signed listing alone. Real
DVC, a real directory remote, real git clones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey, public_pem
from kronos_audit.project.repository import Project
from kronos_audit.storage import cache_object_path, cache_settings, dvc_file_for
from tests.helpers import git, run_cli
from tests.signing.test_directory_steps import dcp_like, tree


def dvc(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=repo, capture_output=True, text=True
    )


@pytest.fixture
def anchor(key: SigningKey, tmp_path: Path) -> str:
    path = tmp_path / "tester.pub"
    path.write_bytes(public_pem(key.private_key.public_key()))
    return str(path)


def pushed_steps(project: Project) -> tuple[Path, Path]:
    """Two chained directory steps, signed, committed and pushed."""
    first = dcp_like(project.root / "dcp" / "step-1", seed=1)
    # Two files of equal bytes: one DVC object, which a checkout by hard link gives both.
    (first / "__1_0.distcp").write_bytes((first / "__0_0.distcp").read_bytes())
    second = dcp_like(project.root / "dcp" / "step-2", seed=2)
    (m1,) = ka.snapshot(first, run="dcp", step=1)
    ka.snapshot(second, run="dcp", step=2, parent=m1.path)
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "two steps")
    done = run_cli("push", cwd=project.root)
    assert done.exit_code == 0, done.output
    assert "pushed 2 checkpoint(s)" in done.output
    return first, second


def test_push_then_a_plain_dvc_pull_in_a_fresh_clone_restores_and_verifies(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path, anchor: str
) -> None:
    first, second = pushed_steps(project)
    status = run_cli("status", str(project.root / "dcp"), cwd=project.root)
    assert status.exit_code == 0, status.output
    assert "2 pushed" in status.output
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    assert not (clone / "dcp" / "step-1").exists()
    gone = run_cli("status", str(clone / "dcp"), cwd=clone)
    assert "2 remote-only" in gone.output, gone.output
    pulled = dvc(clone, "pull")
    assert pulled.returncode == 0, pulled.stderr
    shared = clone / "dcp" / "step-1"
    same = os.stat(shared / "__0_0.distcp").st_ino == os.stat(shared / "__1_0.distcp").st_ino
    assert same == (os.stat(shared / "__0_0.distcp").st_nlink > 1)  # linked, or copies
    for step in (first, second):
        # Every file, the dot-file DCP reads first included.
        assert tree(clone / "dcp" / step.name) == tree(step)
        assert (clone / "dcp" / step.name / ".tool_state").is_file()
    checked = run_cli("verify", str(clone / "dcp"), "--trusted-key", anchor, cwd=clone)
    assert checked.exit_code == 0, checked.output
    assert "2 manifest(s): 2 ok; data checked for 2" in checked.output
    assert "2 pushed" in run_cli("status", str(clone / "dcp"), cwd=clone).output
    assert json.loads(dvc(clone, "status", "--json").stdout) == {}
    log = run_cli("log", str(clone / "dcp"), cwd=clone)
    assert "checkpoints 2 (steps 1..2)" in log.output, log.output


def test_kaudit_pull_follows_the_signed_listing_not_a_dvc_file(
    project: Project, key: SigningKey, remote: Path, tmp_path: Path, anchor: str
) -> None:
    first, _ = pushed_steps(project)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project.root), str(clone))
    # A .dvc file that claims step 2's directory object for step 1.
    other = (clone / "dcp" / "step-2.dvc").read_text().replace("path: step-2", "path: step-1")
    (clone / "dcp" / "step-1.dvc").write_text(other)
    pulled = run_cli("pull", str(clone / "dcp" / "step-1"), "--trusted-key", anchor, cwd=clone)
    assert pulled.exit_code == 0, pulled.output
    assert "(fetched)" in pulled.output
    assert tree(clone / "dcp" / "step-1") == tree(first)
    # DVC, following that .dvc file, brings the other directory: verify names each file.
    restored = clone / "dcp" / "step-1"
    for p in sorted(restored.rglob("*"), reverse=True):
        if p.is_file():
            p.unlink()
        else:
            p.rmdir()
    restored.rmdir()
    assert dvc(clone, "pull", str(dvc_file_for(restored))).returncode == 0
    checked = run_cli("verify", str(restored), "--trusted-key", anchor, cwd=clone)
    assert checked.exit_code == 1, checked.output
    assert "changed: __0_0.distcp" in checked.output
    assert "changed: .tool_state" in checked.output


def test_a_prune_beside_a_directory_step_keeps_the_objects_it_names(
    project: Project, key: SigningKey
) -> None:
    from tests.runtime.test_retention_objects import one_file_run, signed_md5

    # A directory step beside a run holds a copy of the run's first checkpoint: DVC has
    # one object for those bytes, which only the two manifests name.
    run_dir = one_file_run(project, "heat", range(1, 2))
    md5 = signed_md5(run_dir, 1)
    step = project.root / "checkpoints" / "dcp" / "step-1"
    step.mkdir(parents=True)
    (step / "state.h5").write_bytes((run_dir / "step-00000001.h5").read_bytes())
    (m,) = ka.snapshot(step, run="dcp", step=1)
    assert m.record.directory is not None
    assert m.record.directory.files[0].md5 == md5
    # Retention prunes the heat run's step 1: the object stays, the directory step names it.
    one_file_run(project, "heat", range(2, 4), keep=1)
    assert not (run_dir / "step-00000001.h5").exists()
    cache_dir, _ = cache_settings(project)
    assert cache_object_path(cache_dir, md5).is_file()
    assert run_cli("verify", str(step)).exit_code == 0
