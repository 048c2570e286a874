"""The Orbax integration with a real async CheckpointManager, in this process: each
committed step signed from beside Orbax's tree, Orbax still restoring after signing, and a
changed file refused before restore."""

from __future__ import annotations

from pathlib import Path

import pytest

import kronos_audit as ka
from kronos_audit.errors import TamperedData
from kronos_audit.integrations.orbax import signing_callback, verified_step
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import read_manifest


def test_committed_steps_are_signed_and_orbax_still_restores_them(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    monkeypatch.chdir(project.root)
    root = project.root / "orbax"
    sign = signing_callback("jax-run", root, seeds=[3])
    options = ocp.CheckpointManagerOptions(
        async_options=ocp.AsyncOptions(post_finalization_callback=sign)
    )
    with ocp.CheckpointManager(root, options=options) as manager:
        for step in (1, 2, 3):
            manager.save(step, args=ocp.args.StandardSave({"w": jnp.arange(4.0) * step}))
        manager.wait_until_finished()
        sign()  # the last step: Orbax called the callback before it renamed it into place
    manifests = [read_manifest(root / f"{step}.kaudit.json") for step in (1, 2, 3)]
    assert [(m.run, m.step) for m in manifests] == [("jax-run", 1), ("jax-run", 2), ("jax-run", 3)]
    assert [m.parent for m in manifests] == [None, manifests[0].digest, manifests[1].digest]
    assert not list(root.glob("*/*.kaudit.json"))  # nothing inside Orbax's tree
    (result,) = ka.verify(manifests[2].path)
    assert result.ok, result.failures

    # Orbax, opening the root afresh, sees its steps and restores one, the sidecars beside
    with ocp.CheckpointManager(root) as reader:
        assert reader.all_steps() == [1, 2, 3]
        assert verified_step(root, 3) == root / "3"
        restored = reader.restore(3, args=ocp.args.StandardRestore({"w": jnp.zeros(4)}))
    assert restored["w"].tolist() == [0.0, 3.0, 6.0, 9.0]
    # or from a private copy, checked as it was made: Orbax reads what was verified
    copy = verified_step(root, 3, copy_to=project.root.parent / "private")
    with ocp.CheckpointManager(copy.parent) as private:
        restored = private.restore(3, args=ocp.args.StandardRestore({"w": jnp.zeros(4)}))
    assert restored["w"].tolist() == [0.0, 3.0, 6.0, 9.0]

    # a changed byte in one of step 2's files: refused before restore, naming the file
    changed = max(
        (p for p in (root / "2").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
    )
    data = bytearray(changed.read_bytes())
    data[-1] ^= 0x01
    changed.write_bytes(bytes(data))
    with pytest.raises(TamperedData, match=changed.name):
        verified_step(root, 2)


def test_a_step_nobody_signed_is_refused(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project.root)
    (project.root / "orbax" / "7").mkdir(parents=True)
    with pytest.raises(ka.UsageError, match="is not signed"):
        verified_step(Path("orbax"), 7)


@pytest.mark.slow  # one fresh process importing JAX and Orbax, killed with SIGKILL
def test_a_killed_run_resumes_verified_and_its_steps_verify_in_a_fresh_clone(
    project: Project, key: SigningKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal
    import subprocess
    import sys

    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    from examples.orbax_train import run as example
    from kronos_audit.storage import configure_remote
    from tests.helpers import pushed_and_cloned

    monkeypatch.chdir(project.root)
    argv = ["--steps", "30", "--every", "10", "--root", "orbax"]
    crashed = subprocess.run(
        [sys.executable, example.__file__, *argv, "--crash-at", "20"],
        cwd=project.root,
        capture_output=True,
        text=True,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    root = project.root / "orbax"
    # Orbax saves the first step and every tenth; step 20 was committed, never signed
    assert sorted(p.name for p in root.glob("*.kaudit.json")) == ["1.kaudit.json", "10.kaudit.json"]
    resumed = example.main(argv)  # signs step 20 first, then resumes from it verified
    assert resumed["resumed_from"] == 20
    steps = [read_manifest(root / f"{s}.kaudit.json") for s in (1, 10, 20, 30)]
    assert [m.parent for m in steps] == [None, *(m.digest for m in steps[:-1])]

    configure_remote(project, str(tmp_path / "remote"))
    clone = pushed_and_cloned(project.root, tmp_path, "orbax")
    monkeypatch.chdir(clone)
    (result,) = ka.verify(clone / "orbax" / "30.kaudit.json")  # fetched, then checked
    assert result.ok, result.failures
    verified_step(clone / "orbax", 30)
    with ocp.CheckpointManager(clone / "orbax") as manager:
        restored = manager.restore(30, args=ocp.args.StandardRestore({"w": jnp.zeros(8)}))
    assert restored["w"].shape == (8,)


def test_max_to_keep_is_signed_pruning(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    monkeypatch.chdir(project.root)
    root = project.root / "kept"
    sign = signing_callback("jax-run", root, max_to_keep=1)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=1, async_options=ocp.AsyncOptions(post_finalization_callback=sign)
    )
    with ocp.CheckpointManager(root, options=options) as manager:
        for step in (1, 2, 3):
            manager.save(step, args=ocp.args.StandardSave({"w": jnp.arange(4.0) * step}))
        manager.wait_until_finished()
        sign()
        assert manager.all_steps() == [3]
    one, two, three = (read_manifest(root / f"{step}.kaudit.json") for step in (1, 2, 3))
    assert [(e.step, e.manifest) for e in two.record.pruned] == [(1, one.digest)]
    assert [(e.step, e.manifest) for e in three.record.pruned] == [(2, two.digest)]
    assert not (root / "1.dvc").exists()
    assert not (root / "2.dvc").exists()
    results = ka.verify(root)
    assert all(r.ok for r in results), [r.failures for r in results]
    assert sorted(r.statement.step for r in results if r.data_pruned) == [1, 2]  # type: ignore[union-attr]
