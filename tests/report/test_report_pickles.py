"""`kaudit report` marks a run whose checkpoints are pickles: verified, they are still
pickles, and ok does not mean safe to load (as `kaudit show` and verify's note say)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import kronos_audit as ka
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.helpers import run_cli, write_checkpoint

SAFE = "ok does not mean safe to load"


def test_a_pickle_run_is_marked_in_every_format(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    run_dir = project.root / "ckpt"
    run_dir.mkdir()
    parent = None
    for step in (1, 2):
        path = run_dir / f"epoch-{step}.pt"
        torch.save({"w": torch.full((2,), float(step))}, path)
        (m,) = ka.snapshot(path, run="pt", step=step, key=key, parent=parent)
        parent = m.path
    reports = {}
    for ext in ("md", "html", "json"):
        out = tmp_path / f"report.{ext}"
        result = run_cli("report", str(run_dir), "--out", str(out))
        assert result.exit_code == 0, result.output  # a pickle fails nothing: it is marked
        reports[ext] = out.read_text()
    assert "2 checkpoints are pickles: signed by the file digest only" in reports["md"]
    assert f"| ok (a pickle: its file digest only; {SAFE}) |" in reports["md"]
    assert (
        "2 checkpoints are pickles: signed by the file digest only, and unpickling runs "
        f"whatever it holds: {SAFE}." in reports["html"]
    )
    assert f'<span class="warn">(a pickle: its file digest only; {SAFE})</span>' in reports["html"]
    (run,) = json.loads(reports["json"])["runs"]
    verification = run["verification"]
    assert verification["pickles"] == 2
    assert [r.get("note") for r in verification["newest"]] == [
        f"a pickle: its file digest only; {SAFE}"
    ] * 2


def test_a_run_of_hdf5_checkpoints_is_not_marked(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    ckpt = write_checkpoint(project.root / "checkpoints" / "one" / "step-00000001.h5")
    ka.snapshot(ckpt, run="one", step=1, key=key)
    out = tmp_path / "report.json"
    assert run_cli("report", str(ckpt.parent), "--out", str(out)).exit_code == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["verification"]["pickles"] == 0
    assert "note" not in run["verification"]["newest"][0]
    md = tmp_path / "report.md"
    assert run_cli("report", str(ckpt.parent), "--out", str(md)).exit_code == 0
    assert SAFE not in md.read_text()
