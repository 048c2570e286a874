"""`kaudit replay` of a step of a multi-rank run, under a real mpiexec: the recorded command
started again on N ranks (recorded, or --ranks), every rank resuming from the verified
parent step, the produced step compared bitwise with the recorded one (Block arrays as
global arrays, so any rank count compares)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import h5py
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.layout import shard_path, step_directory
from kronos_audit.checkpoint.shards import parse_index
from kronos_audit.errors import ReplayError, Stage
from kronos_audit.keys.home import select_key
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.replay import SCHEMA_NAME
from kronos_audit.replay.sharded import StepOutput, compare_by_digests, compare_steps
from kronos_audit.statement.schemas import validate
from tests.helpers import assert_bad_input, recorded_once, run_cli
from tests.parallel.launch import RankProgram, launched, launcher_env, rank_program
from tests.replay.helpers import bad_input, commit_all, resign, shared_project
from tests.runtime.test_faults import EXAMPLES, HANG_GUARD

pytestmark = pytest.mark.slow

NOISY_MPI = '''\
"""Strips of a field on several ranks; rank 1 adds bytes from os.urandom: not reproducible."""
import os

import numpy as np
from mpi4py import MPI

import kronos_audit as ka

comm = MPI.COMM_WORLD
layout = {"u": ka.Block(axis=0), "noise": ka.Block(axis=0)}
with ka.Run("noisy-mpi", root="checkpoints", seed=7, every=ka.EverySteps(2)) as run:
    state = run.restore()
    if state is None:
        rows = len(np.array_split(np.arange(12), comm.size)[comm.rank])
        state = {"u": np.full((rows, 4), float(comm.rank)), "noise": np.zeros((rows, 2))}
    for step in run.steps(4):
        noise = np.zeros_like(state["noise"])
        if comm.rank == 1:
            raw = np.frombuffer(os.urandom(noise.size), dtype=np.uint8)
            noise[:] = raw.reshape(noise.shape)
        state = {"u": state["u"] * 0.5 + 1.0, "noise": state["noise"] + noise}
        run.checkpoint(step, state, layout=layout)
'''

ORDER_MPI = '''\
"""Strips of a field on several ranks; each step adds to every cell a sum of many float
terms of wide range, taken in the order KAUDIT_TEST_ORDER names (forward or reverse):
float addition is not associative, so the two orders differ in the last bits."""
import os
import sys

import numpy as np
from mpi4py import MPI

import kronos_audit as ka
from kronos_audit.parallel.layout import block_range

ROWS, COLS, TERMS = 12, 4, 200
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
reverse = os.environ.get("KAUDIT_TEST_ORDER") == "reverse"
order = range(TERMS - 1, -1, -1) if reverse else range(TERMS)
comm = MPI.COMM_WORLD
layout = {"u": ka.Block(axis=0), "total": ka.Replicated()}
with ka.Run("order-mpi", root="checkpoints", seed=5, every=ka.EverySteps(2)) as run:
    start, stop = block_range(ROWS, comm.size, comm.rank)
    state = run.restore()
    if state is None:
        state = {"u": np.zeros((stop - start, COLS)), "total": np.zeros(1)}
    for step in run.steps(STEPS):
        g = np.random.default_rng(step)  # the same terms whatever the rank count
        shape = (ROWS, COLS, TERMS)
        terms = g.standard_normal(shape) * 10.0 ** g.integers(-8, 8, shape)
        sums = np.zeros((stop - start, COLS))
        for k in order:
            sums += terms[start:stop, :, k]
        u = state["u"] + sums
        state = {"u": u, "total": np.array([comm.allreduce(float(u.sum()))])}
        run.checkpoint(step, state, layout=layout)
'''


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Replays make their work directories here, where a test can see what is left behind.
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    # The replay's mpiexec inherits this process's environment (Open MPI refuses root
    # unless told twice; the CI container runs as root). No instruction leaks in.
    for name, value in launcher_env().items():
        if name.startswith("OMPI_ALLOW") or name == "PYTHONUNBUFFERED":
            monkeypatch.setenv(name, value)
    for var in (
        "KAUDIT_RESUME_FROM",
        "KAUDIT_STOP_AT",
        "KAUDIT_OUT",
        "KAUDIT_SEED",
        "KAUDIT_REPLAY_SHARDED",
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def repo(project: Project, key: SigningKey) -> Path:
    root = project.root
    (root / "heat_mpi").mkdir()
    shutil.copy(EXAMPLES / "heat_mpi" / "run.py", root / "heat_mpi" / "run.py")
    rank_program(NOISY_MPI, at=root / "noisy_mpi.py")
    commit_all(root, "programs")
    return root


def step_manifest(run_dir: Path, step: int) -> Path:
    return step_directory(run_dir, step) / "index.jsonl.kaudit.json"


@pytest.fixture
def heat(
    repo_templates: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """examples/heat_mpi on 3 ranks, 6 steps of a 25-row grid, a step every 2: its run
    directory, in a copy of the project of the test's own (tests change its files), with
    KAUDIT_HOME the home of the key that signed it (``select_key("tester")`` there). The
    run is launched once for the session: every test here reads or replays it, none needs
    a launch of its own."""

    def record(into: Path) -> None:
        with pytest.MonkeyPatch.context() as mp:
            project, home = shared_project(mp, repo_templates, tmp_path_factory)
            root = project.root
            (root / "heat_mpi").mkdir()
            shutil.copy(EXAMPLES / "heat_mpi" / "run.py", root / "heat_mpi" / "run.py")
            commit_all(root, "programs")
            heat_mpi = RankProgram(root, "heat_mpi/run.py")
            heat_mpi.completed(3, "--n", "25", "--steps", "6", "--every", "2")
        shutil.move(root, into / "repo")
        shutil.move(home, into / "home")

    copy = recorded_once("replay-heat-mpi", tmp_path_factory, record)
    monkeypatch.setenv("KAUDIT_HOME", str(copy / "home"))
    return copy / "repo" / "checkpoints" / "heat-mpi"


def replay_json(manifest: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("replay", str(manifest), "--json", *args)
    assert result.exit_code in (0, 1), result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    validate(doc, schema_name=SCHEMA_NAME, what="kaudit replay --json")
    return result.exit_code, doc


def test_the_step_manifest_records_the_launcher_and_the_command_is_the_programs(
    heat: Path,
) -> None:
    m = ka.read_manifest(step_manifest(heat, 4))
    assert m.record.shards is not None
    assert (m.record.shards.count, m.record.shards.launcher) == (3, "mpi")
    command = m.record.command
    assert command is not None
    assert command[:2] == ("python", "heat_mpi/run.py")


def test_a_heat_mpi_step_replays_bitwise_on_the_recorded_ranks_and_on_two(heat: Path) -> None:
    target = step_manifest(heat, 4)
    status, doc = replay_json(target)
    assert (status, doc["outcome"]) == (0, "REPRODUCED"), doc
    executed = doc["command"]["executed"]
    assert executed[1:4] == ["--oversubscribe", "-n", "3"]
    assert doc["ranks"] == 3
    paths = {d["path"]: d["verdict"] for d in doc["datasets"]}
    # The global field, the replicated scalars, and each rank's generators rank by rank.
    assert paths["/fields/u"] == "IDENTICAL"
    assert paths["/time"] == paths["/iterations"] == "IDENTICAL"
    assert any(p.endswith("(rank 2)") for p in paths)
    assert "uncompared" not in doc
    u = next(d for d in doc["datasets"] if d["path"] == "/fields/u")
    assert u["recorded"]["shape"] == [25, 25]

    # On two ranks: the field's strips are cut differently, the global field is the same.
    shown = run_cli("replay", str(target), "--ranks", "2")
    assert shown.exit_code == 0, shown.output
    assert "REPRODUCED" in shown.output
    assert "NOT REPRODUCED" not in shown.output
    assert "ranks        2, launched with mpiexec" in shown.output
    assert "not compared:" in shown.output
    assert "per-rank" in shown.output
    status, doc = replay_json(target, "--ranks", "2")
    assert (status, doc["outcome"]) == (0, "REPRODUCED"), doc
    assert doc["command"]["executed"][1:4] == ["--oversubscribe", "-n", "2"]
    paths = {d["path"]: d["verdict"] for d in doc["datasets"]}
    assert paths["/fields/u"] == "IDENTICAL"
    assert not any("(rank" in p for p in paths)
    assert doc["uncompared"]


def test_with_its_shards_gone_a_step_replays_on_two_ranks_by_its_signed_digests(
    heat: Path,
) -> None:
    """The step manifest signs each declared array's digest (a Block array's is the
    global array's, the same on any rank count): a bitwise replay on 2 ranks of a 3-rank
    step whose shards are gone, from here and from any remote, compares by them."""
    step = step_directory(heat, 4)
    for r in range(3):
        shard_path(step, r, 3).unlink()
    status, doc = replay_json(step_manifest(heat, 4), "--ranks", "2")
    assert (status, doc["outcome"], doc["ranks"]) == (0, "REPRODUCED", 2), doc
    paths = {d["path"]: d["verdict"] for d in doc["datasets"]}
    assert paths == {"/fields/u": "IDENTICAL", "/time": "IDENTICAL", "/iterations": "IDENTICAL"}
    (said,) = doc["uncompared"]
    assert "records no digest" in said
    assert "rng" in said
    assert not any(shard_path(step, r, 3).exists() for r in range(3))  # nothing fetched


def test_by_digests_one_cell_of_a_block_differing_fails_that_array_alone(heat: Path) -> None:
    step = step_directory(heat, 4)
    m = ka.read_manifest(step_manifest(heat, 4))
    assert m.record.shards is not None
    copy = heat.parent / "copy" / step.name
    shutil.copytree(step, copy)
    records = parse_index((copy / "index.jsonl").read_bytes(), 3)
    results, _ = compare_by_digests(m.record.shards.layout, StepOutput(copy, records, ""))
    assert all(r.ok for r in results)
    with h5py.File(shard_path(copy, 2, 3), "r+") as f:
        f["fields/u"][0, 3] += 1e-12
    results, _ = compare_by_digests(m.record.shards.layout, StepOutput(copy, records, ""))
    assert [(r.path, r.verdict.value) for r in results if not r.ok] == [("/fields/u", "DIFFERENT")]


def test_the_first_step_replays_from_the_start_on_one_rank(heat: Path) -> None:
    # No parent: the one rank starts from the recorded seed and still writes a step (one
    # shard and its index), compared with the 3-rank step as global arrays.
    status, doc = replay_json(step_manifest(heat, 2), "--ranks", "1")
    assert (status, doc["outcome"], doc["parent"]) == (0, "REPRODUCED", None), doc
    assert doc["ranks"] == 1
    assert {d["path"] for d in doc["datasets"]} >= {"/fields/u", "/time", "/iterations"}


def test_one_cell_of_a_block_differing_fails_that_array_alone(heat: Path) -> None:
    """The comparison reads the blocks' data: one cell of rank 2's strip, changed in a copy
    of the step, makes /fields/u differ and nothing else."""
    step = step_directory(heat, 4)
    m = ka.read_manifest(step_manifest(heat, 4))
    assert m.record.shards is not None
    copy = heat.parent / "copy" / step.name
    shutil.copytree(step, copy)
    with h5py.File(shard_path(copy, 2, 3), "r+") as f:
        f["fields/u"][0, 3] += 1e-12
    records = parse_index((copy / "index.jsonl").read_bytes(), 3)
    results, uncompared = compare_steps(
        step, 3, m.record.shards.layout, StepOutput(copy, records, "")
    )
    assert [r.path for r in results if not r.ok] == ["/fields/u"]
    assert uncompared == []


def test_a_shard_whose_block_is_an_external_link_is_refused_not_followed(heat: Path) -> None:
    """A produced shard is listed as verify lists a checkpoint before any array is read by
    name: its strip replaced by an external link to the recorded strip (which would
    compare equal if followed) is refused, in one line."""
    step = step_directory(heat, 4)
    m = ka.read_manifest(step_manifest(heat, 4))
    assert m.record.shards is not None
    copy = heat.parent / "copy" / step.name
    shutil.copytree(step, copy)
    with h5py.File(shard_path(copy, 2, 3), "r+") as f:
        del f["fields/u"]
        f["fields/u"] = h5py.ExternalLink(str(shard_path(step, 2, 3)), "/fields/u")
    records = parse_index((copy / "index.jsonl").read_bytes(), 3)
    with pytest.raises(ReplayError, match="external link") as caught:
        compare_steps(step, 3, m.record.shards.layout, StepOutput(copy, records, ""))
    assert caught.value.stage == Stage.COMPARE


def test_a_rank_adding_noise_is_not_reproduced_naming_the_dataset(repo: Path) -> None:
    RankProgram(repo, "noisy_mpi.py").completed(3)
    target = step_manifest(repo / "checkpoints" / "noisy-mpi", 4)
    result = run_cli("replay", str(target))
    assert result.exit_code == 1, result.output
    assert "NOT REPRODUCED" in result.output
    assert "/noise" in result.output
    status, doc = replay_json(target)
    failing = [d["path"] for d in doc["datasets"] if not d["ok"]]
    assert (status, failing) == (1, ["/noise"])


def test_ranks_is_refused_for_a_checkpoint_in_one_file(project: Project, key: SigningKey) -> None:
    root = project.root
    (root / "heat").mkdir()
    shutil.copy(EXAMPLES / "heat" / "run.py", root / "heat" / "run.py")
    commit_all(root, "heat")
    done = subprocess.run(
        [sys.executable, "run.py", "--steps", "4", "--every", "2", "--n", "8"],
        cwd=root / "heat",
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert done.returncode == 0, done.stderr
    target = root / "heat" / "checkpoints" / "heat" / "step-00000004.h5.kaudit.json"
    assert_bad_input(run_cli("replay", str(target), "--ranks", "2"), "--ranks")


def test_a_launch_it_cannot_make_and_a_bad_tolerance_are_refused_before_anything_runs(
    heat: Path, tmp_path: Path
) -> None:
    target = step_manifest(heat, 4)
    key = select_key("tester")  # the key that signed the run, trusted by its project
    bad_input(run_cli("replay", str(target), "--tol", "fields/u:rtol=x"), "rtol")

    def unknown(predicate: dict[str, Any]) -> None:
        del predicate["shards"]["launcher"]

    resign(target, key, unknown)
    bad_input(run_cli("replay", str(target)), "records no launcher", "written on 3 rank(s)")
    assert not list((tmp_path / "tmp").glob("kaudit-replay-*"))


def test_a_recorded_shard_renamed_over_after_verification_is_not_compared(heat: Path) -> None:
    """The comparison reads each recorded shard only as the bytes the verified index
    signs: a recorded shard replaced by the replay's own (changed) strip, which would
    compare equal, is refused in one line rather than compared."""
    step = step_directory(heat, 4)
    m = ka.read_manifest(step_manifest(heat, 4))
    assert m.record.shards is not None
    copy = heat.parent / "copy" / step.name
    shutil.copytree(step, copy)
    with h5py.File(shard_path(copy, 2, 3), "r+") as f:
        f["fields/u"][0, 3] += 1e-12
    records = parse_index((copy / "index.jsonl").read_bytes(), 3)
    swapped = step / "swapped"
    shutil.copyfile(shard_path(copy, 2, 3), swapped)
    os.replace(swapped, shard_path(step, 2, 3))
    with pytest.raises(ReplayError, match=r"rank-000002-of-000003\.h5: .* changed after") as caught:
        compare_steps(
            step, 3, m.record.shards.layout, StepOutput(copy, records, ""), m.subject_sha256
        )
    assert caught.value.stage == Stage.COMPARE


@pytest.fixture(scope="module")
def order_run(
    repo_templates: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """ORDER_MPI committed in a project, run on 3 ranks to step 4, then on one process to
    step 6, its sums forward: the run directory, and the KAUDIT_HOME of the key that
    signed it."""

    def record(into: Path) -> None:
        with pytest.MonkeyPatch.context() as mp:
            project, home = shared_project(mp, repo_templates, tmp_path_factory)
            program = rank_program(ORDER_MPI, at=project.root / "order_mpi.py")
            commit_all(project.root, "program")
            program.completed(3)
            # Continued on one process, without a launcher: step 6 is a step of one shard.
            done = launched([sys.executable, "order_mpi.py", "6"], project.root)
            assert done.returncode == 0, done.stderr
        shutil.move(project.root, into / "repo")
        shutil.move(home, into / "home")

    copy = recorded_once("order-mpi", tmp_path_factory, record)
    return copy / "repo" / "checkpoints" / "order-mpi", copy / "home"


@pytest.fixture
def reversed_sums(order_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    """The manifest of step 4 of the shared run, to be replayed with its sums reversed
    (the replay's environment alone says so)."""
    run_dir, home = order_run
    monkeypatch.setenv("KAUDIT_HOME", str(home))
    monkeypatch.setenv("KAUDIT_TEST_ORDER", "reverse")
    return step_manifest(run_dir, 4)


def by_path(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["path"]: d for d in doc["datasets"]}


def test_a_sum_in_another_order_fails_bitwise_and_passes_within_a_tolerance(
    reversed_sums: Path,
) -> None:
    # Bitwise: the field and its total differ in their last bits, and the report says
    # where and by how much (the recorded data is read to explain it).
    status, doc = replay_json(reversed_sums)
    assert (status, doc["outcome"], doc["basis"]) == (1, "NOT_REPRODUCED", "hashes"), doc
    assert [d["path"] for d in doc["datasets"] if not d["ok"]] == ["/total", "/u"]
    u = by_path(doc)["/u"]["comparison"]
    assert u["shape_a"] == [12, 4]
    assert u["differing"] > 0
    assert 0 < u["max_rel_error"] < 1e-9

    # A tolerance that covers the difference: within it, dataset by dataset against the
    # recorded data; the rest (each rank's generators, kaudit's records) still identical.
    status, doc = replay_json(reversed_sums, "--rtol", "1e-9")
    assert (status, doc["outcome"], doc["basis"]) == (0, "REPRODUCED_WITHIN_TOLERANCE", "data")
    datasets = by_path(doc)
    assert datasets["/u"]["verdict"] == datasets["/total"]["verdict"] == "WITHIN_TOLERANCE"
    assert datasets["/u"]["comparison"]["rule"] == "global rtol=1e-09,atol=0"
    assert datasets["/u"]["replayed"]["sha256"] != datasets["/u"]["recorded"]["sha256"]
    others = [d for p, d in datasets.items() if p not in ("/u", "/total")]
    assert others
    assert all(d["verdict"] == "IDENTICAL" for d in others)
    assert any(p.endswith("(rank 2)") for p in datasets)
    assert doc["ranks"] == 3

    # One too tight: the elements it does not cover are counted and shown.
    shown = run_cli("replay", str(reversed_sums), "--rtol", "1e-18")
    assert shown.exit_code == 1, shown.output
    assert "NOT REPRODUCED" in shown.output
    assert "against the recorded data" in shown.output
    assert "/u" in shown.output
    assert "of 48 elements fail" in shown.output, shown.output


def test_on_another_rank_count_tolerances_apply_to_the_global_arrays(
    reversed_sums: Path,
) -> None:
    """On 2 ranks (recorded on 3) the blocks are cut differently, and the total is summed
    over the ranks in another order too: [compare] in the project's config gives the
    tolerance, a --tol rule overrides it for one array."""
    config = reversed_sums.parents[3] / ".kaudit" / "config.toml"
    original = config.read_text()
    try:
        config.write_text(original + '\n[compare]\nrtol = 1e-9\ntol = ["rng/*:exact"]\n')
        status, doc = replay_json(reversed_sums, "--ranks", "2", "--tol", "u:rtol=1e-18")
        assert (status, doc["outcome"], doc["ranks"]) == (1, "NOT_REPRODUCED", 2), doc
        datasets = by_path(doc)
        assert [p for p, d in datasets.items() if not d["ok"]] == ["/u"]
        assert datasets["/total"]["verdict"] == "WITHIN_TOLERANCE"
        assert datasets["/total"]["comparison"]["rule"] == "global rtol=1e-09,atol=0"
        assert datasets["/u"]["comparison"]["rule"] == "--tol u:rtol=1e-18,atol=0"
        assert datasets["/u"]["comparison"]["mismatches"] > 0
        assert doc["uncompared"]
    finally:
        config.write_text(original)


def test_a_step_one_process_wrote_replays_on_one_process_without_a_launcher(
    order_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, home = order_run
    monkeypatch.setenv("KAUDIT_HOME", str(home))
    target = step_manifest(run_dir, 6)
    m = ka.read_manifest(target)
    assert m.record.shards is not None
    assert (m.record.shards.count, m.record.shards.launcher) == (1, None)
    shown = run_cli("replay", str(target))
    assert shown.exit_code == 0, shown.output
    assert "ranks        1, one process, no launcher" in shown.output
    assert "REPRODUCED: " in shown.output
    # Its parent was written on 3 ranks: the one process resumed from it, re-cut.
    assert "resumed from step 4" in shown.output
    # How to start it on 2 is not recorded: refused before anything runs.
    bad_input(run_cli("replay", str(target), "--ranks", "2"), "records no launcher")
