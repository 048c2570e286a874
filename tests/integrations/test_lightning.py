"""The Lightning integration with the real Lightning Trainer, in this process: each save
signed as a step of the run, a resume verified, a changed checkpoint refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import kronos_audit as ka
from kronos_audit.errors import TamperedData
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.statement.manifest import read_manifest

if TYPE_CHECKING:
    from tests.integrations.lightning_tiny import Tiny


@pytest.fixture
def trained(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Tiny]:
    from tests.integrations.lightning_tiny import fit

    monkeypatch.chdir(project.root)
    root = project.root / "checkpoints"
    return root, fit(root, 4)


def test_every_save_is_a_signed_step_chained_to_the_one_before(trained: tuple[Path, Tiny]) -> None:
    root, _ = trained
    ckpts = sorted(root.glob("*.ckpt"), key=lambda p: p.stat().st_mtime_ns)
    assert [p.name for p in ckpts] == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]
    first, second = (read_manifest(p.with_name(p.name + ".kaudit.json")) for p in ckpts)
    assert (first.run, first.step, first.parent) == ("lit", 2, None)
    assert (second.step, second.parent) == (4, first.digest)
    (result,) = ka.verify(second.path)
    assert result.ok, result.failures


def test_a_resume_loads_the_verified_checkpoint(trained: tuple[Path, Tiny]) -> None:
    import torch

    from tests.integrations.lightning_tiny import fit

    root, model = trained
    resumed = fit(root, 6, ckpt_path=root / "epoch=0-step=4.ckpt")
    (signed,) = root.glob("*step=6.ckpt.kaudit.json")
    parent = read_manifest(root / "epoch=0-step=4.ckpt.kaudit.json")
    assert read_manifest(signed).parent == parent.digest
    assert not torch.equal(resumed.layer.weight, model.layer.weight)  # it trained on


def test_last_ckpt_saved_at_every_step_is_signed_again_each_time(
    trained: tuple[Path, Tiny],
) -> None:
    from tests.integrations.lightning_tiny import fit

    root, _ = trained
    fit(root, 6, ckpt_path=root / "epoch=0-step=4.ckpt", last=True)
    last = read_manifest(root / "last.ckpt.kaudit.json")  # saved beside step 6, then signed
    six = read_manifest(next(root.glob("*step=6.ckpt.kaudit.json")))
    four = read_manifest(root / "epoch=0-step=4.ckpt.kaudit.json")
    assert (last.step, last.parent, six.parent) == (6, four.digest, four.digest)
    (result,) = ka.verify(last.path)
    assert result.ok, result.failures


def test_a_changed_checkpoint_is_refused_before_lightning_reads_it(
    trained: tuple[Path, Tiny],
) -> None:
    from tests.integrations.lightning_tiny import fit

    root, _ = trained
    ckpt = root / "epoch=0-step=4.ckpt"
    data = bytearray(ckpt.read_bytes())
    data[len(data) // 2] ^= 0x01
    ckpt.write_bytes(bytes(data))
    with pytest.raises(TamperedData, match=r"epoch=0-step=4\.ckpt: refused to load"):
        fit(root, 6, ckpt_path=ckpt)


def test_pushed_steps_verify_and_resume_in_a_fresh_clone(
    trained: tuple[Path, Tiny], project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kronos_audit.storage import configure_remote
    from tests.helpers import pushed_and_cloned
    from tests.integrations.lightning_tiny import fit

    configure_remote(project, str(tmp_path / "remote"))
    clone = pushed_and_cloned(project.root, tmp_path, "checkpoints")
    monkeypatch.chdir(clone)
    ckpt = clone / "checkpoints" / "epoch=0-step=4.ckpt"
    assert not ckpt.exists()
    (result,) = ka.verify(ckpt.with_name(ckpt.name + ".kaudit.json"))  # fetched, then checked
    assert result.ok, result.failures
    resumed = fit(clone / "checkpoints", 6, ckpt_path=ckpt)
    assert resumed.layer.weight.shape == (1, 4)
    assert list((clone / "checkpoints").glob("*step=6.ckpt.kaudit.json"))


def test_rotation_is_signed_pruning_and_a_deletion_by_hand_is_not(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kronos_audit.storage.tracking import cache_object_path, cache_settings
    from tests.helpers import run_cli
    from tests.integrations.lightning_tiny import fit

    monkeypatch.chdir(project.root)
    root = project.root / "rotated"
    fit(root, 6, top_k=1)  # three saves, the newest kept: Lightning removes two
    assert [p.name for p in root.glob("*.ckpt")] == ["epoch=1-step=6.ckpt"]
    two, four, six = (
        read_manifest(next(root.glob(f"*-step={n}.ckpt.kaudit.json"))) for n in (2, 4, 6)
    )
    # each removal signed by the step saved just before it, then chained on
    assert [(e.step, e.manifest) for e in four.record.pruned] == [(2, two.digest)]
    assert [(e.step, e.manifest) for e in six.record.pruned] == [(4, four.digest)]
    assert (four.parent, six.parent) == (two.digest, four.digest)
    cache = cache_settings(project)[0]
    for gone in (two, four):
        assert not gone.checkpoint_path.with_name(gone.checkpoint_path.name + ".dvc").exists()
        assert gone.subject_md5 is not None
        assert not cache_object_path(cache, gone.subject_md5).exists()  # the space freed
    assert f"/{six.checkpoint_path.name}" in (root / ".gitignore").read_text()
    assert "epoch=0-step=2" not in (root / ".gitignore").read_text()
    results = ka.verify(root)
    assert all(r.ok for r in results), [r.failures for r in results]
    assert sorted(r.statement.step for r in results if r.data_pruned) == [2, 4]  # type: ignore[union-attr]
    shown = run_cli("verify", "rotated", cwd=project.root)
    assert shown.exit_code == 0, shown.output
    assert "pruned" in shown.output
    log = run_cli("log", "rotated", cwd=project.root)
    assert log.exit_code == 0, log.output
    assert "1 local, 2 pruned" in log.output, log.output

    six.checkpoint_path.unlink()  # by hand: no signed record says so
    refused = run_cli("verify", "--no-fetch", "rotated", cwd=project.root)
    assert refused.exit_code != 0, refused.output
    assert "epoch=1-step=6.ckpt: checkpoint file not found (no signed retention record" in " ".join(
        refused.output.split()
    )


def test_a_removal_with_no_later_step_is_recorded_by_the_next_save(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from kronos_audit.integrations.lightning import SignedCheckpointIO

    monkeypatch.chdir(project.root)
    root = project.root / "twice"
    io = SignedCheckpointIO(run="lit")
    state = {"global_step": 2, "w": torch.zeros(2)}
    io.save_checkpoint(state, root / "a.ckpt")
    io.save_checkpoint(state, root / "b.ckpt")  # one step under two names
    io.remove_checkpoint(root / "a.ckpt")  # no later step yet to sign its removal
    assert not (root / "a.ckpt").exists()
    assert (root / "a.ckpt.dvc").exists()  # its tracking stays until a record is signed
    io.save_checkpoint({"global_step": 4, "w": torch.ones(2)}, root / "c.ckpt")
    a, c = (read_manifest(root / f"{n}.ckpt.kaudit.json") for n in "ac")
    assert [(e.step, e.manifest) for e in c.record.pruned] == [(2, a.digest)]
    assert not (root / "a.ckpt.dvc").exists()
    results = ka.verify(root)
    assert all(r.ok for r in results), [r.failures for r in results]
    assert [r.manifest.name for r in results if r.data_pruned] == ["a.ckpt.kaudit.json"]


@pytest.mark.slow  # one fresh process importing Lightning, killed with SIGKILL
def test_a_run_killed_mid_training_resumes_from_its_last_signed_step(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal
    import subprocess
    import sys

    from examples.lightning_train import run as example

    monkeypatch.chdir(project.root)
    argv = ["--steps", "8", "--every", "4", "--root", "ckpt"]
    crashed = subprocess.run(
        [sys.executable, example.__file__, *argv, "--crash-at", "6"],
        cwd=project.root,
        capture_output=True,
        text=True,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    signed = sorted(p.name for p in (project.root / "ckpt").glob("*.kaudit.json"))
    assert signed == ["epoch=0-step=4.ckpt.kaudit.json"]  # step 6 died before any save
    resumed = example.main(argv)
    assert resumed["resumed_from"] == "epoch=0-step=4.ckpt"
    assert resumed["step"] == 8
    uninterrupted = example.main([*argv[:-1], "ckpt-uninterrupted"])
    assert resumed["weights"] == uninterrupted["weights"]  # resumed at an epoch's end: bitwise
