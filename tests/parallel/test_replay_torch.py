"""`kaudit replay` of a step of a torchrun run (gloo, CPU), for real: the recorded command
started again under `torchrun --standalone --nproc_per_node N` (N recorded, or --ranks),
every rank resuming from the verified parent step, the produced step compared with the
recorded one as global arrays. One recorded run (module-scoped) serves every test."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.layout import shard_path, step_directory
from kronos_audit.replay import SCHEMA_NAME
from kronos_audit.statement.schemas import validate
from tests.helpers import recorded_once, run_cli
from tests.parallel import launch
from tests.replay.helpers import bad_input, commit_all, shared_project

pytestmark = pytest.mark.slow

# The shape of tests/parallel/test_run_torch.py's program: each rank its own rows of a
# model state, ka.Block(0), and the job's own collective beside kaudit's.
TRAIN_PROGRAM = """
import torch
import torch.distributed as dist
import kronos_audit as ka
from kronos_audit.parallel.layout import block_range

ROWS, COLS = 9, 4
with ka.Run("torch-replay", seed=7, every=ka.EverySteps(2)) as run:
    start, stop = block_range(ROWS, run.size, run.rank)
    target = torch.arange(ROWS * COLS, dtype=torch.float64).reshape(ROWS, COLS)[start:stop].sin()
    state = run.restore()
    if state is None:
        g = torch.Generator().manual_seed(run.seed)
        w = torch.randn(ROWS, COLS, generator=g, dtype=torch.float64)[start:stop].clone()
        state = {"w": w, "m": torch.zeros_like(w)}
    w, m = state["w"], state["m"]
    for step in run.steps(4):
        grad = w - target
        m = 0.9 * m + grad
        w = w - 0.05 * m
        if dist.is_initialized():
            loss = (grad**2).sum()
            dist.all_reduce(loss)
        run.checkpoint(step, {"w": w, "m": m}, layout={"w": ka.Block(0), "m": ka.Block(0)})
"""


@dataclass(frozen=True)
class Recorded:
    root: Path
    """The project the run was recorded in."""
    home: Path
    """The KAUDIT_HOME holding the key that signed it (trusted by the project)."""

    @property
    def run_dir(self) -> Path:
        return self.root / "checkpoints" / "torch-replay"

    def manifest(self, step: int) -> Path:
        return step_directory(self.run_dir, step) / "index.jsonl.kaudit.json"


@pytest.fixture(scope="module")
def recorded(
    repo_templates: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Recorded:
    """The program committed in a kaudit project and run once under torchrun on 2 ranks:
    steps 2 and 4 signed."""

    def record(into: Path) -> None:
        with pytest.MonkeyPatch.context() as mp:
            project, home = shared_project(mp, repo_templates, tmp_path_factory)
            mp.delenv("OMP_NUM_THREADS", raising=False)  # torchrun sets it for its workers
            root = project.root
            (root / "train.py").write_text(textwrap.dedent(TRAIN_PROGRAM))
            commit_all(root, "program")
            logs = str(tmp_path_factory.mktemp("torchrun-logs"))  # not left in /tmp
            done = launch.launched(launch.torchrun(2, "--log-dir", logs, "train.py"), root)
            assert done.returncode == 0, done.stdout + done.stderr
        shutil.move(root, into / "repo")
        shutil.move(home, into / "home")

    copy = recorded_once("torchrun", tmp_path_factory, record)
    return Recorded(copy / "repo", copy / "home")


@pytest.fixture(autouse=True)
def environment(
    kaudit_home: Path, recorded: Recorded, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The key that signed the run is the user's; replays make their work directories
    # where a test sees what is left behind; no instruction leaks in.
    monkeypatch.setenv("KAUDIT_HOME", str(recorded.home))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for var in (
        "KAUDIT_RESUME_FROM",
        "KAUDIT_STOP_AT",
        "KAUDIT_OUT",
        "KAUDIT_SEED",
        "KAUDIT_REPLAY_SHARDED",
    ):
        monkeypatch.delenv(var, raising=False)


def replay_json(manifest: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("replay", str(manifest), "--json", *args)
    assert result.exit_code in (0, 1), result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    validate(doc, schema_name=SCHEMA_NAME, what="kaudit replay --json")
    return result.exit_code, doc


def test_a_torchrun_step_records_its_launcher(recorded: Recorded) -> None:
    m = ka.read_manifest(recorded.manifest(4))
    assert m.record.shards is not None
    assert (m.record.shards.count, m.record.shards.launcher) == (2, "torch.distributed")
    assert m.record.command == ("python", "train.py")


def drift(doc: dict[str, Any]) -> list[str]:
    return [d["name"] for d in doc["environment"]["drift"]]


def test_a_torchrun_step_replays_bitwise_under_torchrun(recorded: Recorded) -> None:
    # --env strict: torchrun gives its workers OMP_NUM_THREADS=1, as it gave the recorded
    # ones; that is not drift from the lock they recorded.
    status, doc = replay_json(recorded.manifest(4), "--env", "strict")
    assert (status, doc["outcome"], doc["ranks"]) == (0, "REPRODUCED", 2), doc
    assert drift(doc) == []
    executed = doc["command"]["executed"]
    assert Path(executed[0]).name == "torchrun"
    assert executed[1:5] == ["--standalone", "--nproc_per_node", "2", "--log-dir"]
    assert executed[6:] == ["--no-python", sys.executable, "train.py"]
    # torchrun's own logs went into the replay's work directory, removed with it.
    logs = Path(executed[5])
    assert logs.parent.name.startswith("kaudit-replay-")
    assert not logs.parent.exists()
    paths = {d["path"]: d["verdict"] for d in doc["datasets"]}
    assert paths["/w"] == paths["/m"] == "IDENTICAL"
    w = next(d for d in doc["datasets"] if d["path"] == "/w")
    assert w["recorded"]["shape"] == [9, 4]
    assert any(p.endswith("(rank 1)") for p in paths)  # each rank's generators
    assert not list((Path(tempfile.gettempdir())).glob("kaudit-replay-*"))


def test_on_one_rank_the_blocks_are_compared_as_global_arrays(recorded: Recorded) -> None:
    shown = run_cli("replay", str(recorded.manifest(4)), "--ranks", "1")
    assert shown.exit_code == 0, shown.output
    assert "ranks        1, launched with torchrun" in shown.output
    # /w and /m as the global 9 x 4 arrays, and kaudit's record of the state's structure.
    assert "REPRODUCED: 3 datasets: 3 identical" in shown.output
    assert "not compared: 4 per-rank dataset(s)" in shown.output  # each rank's generators
    # One worker: torchrun leaves OMP_NUM_THREADS alone, the recorded workers had 1.
    assert "OMP_NUM_THREADS 1 removed" in shown.output


def test_a_tampered_recorded_shard_is_refused_before_anything_runs(recorded: Recorded) -> None:
    shard = shard_path(step_directory(recorded.run_dir, 4), 1, 2)
    original = shard.read_bytes()
    try:
        with h5py.File(shard, "r+") as f:
            f["w"][0, 0] += 1.0
        line = bad_input(run_cli("replay", str(recorded.manifest(4))), "does not verify")
        assert "shard of rank 1 of 2: sha256 mismatch" in line
        assert not list((Path(tempfile.gettempdir())).glob("kaudit-replay-*"))
    finally:
        shard.write_bytes(original)
