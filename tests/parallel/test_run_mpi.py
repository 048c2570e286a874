"""ka.Run on several ranks under a real mpiexec: sharded steps, two-phase commit, agreed
restore, restarts on another rank count, preemption, verify.

The program is examples/heat_mpi (strips with halo exchange, checkpointed with
``layout={"fields/u": ka.Block(axis=0), ...}``); its final digest is the serial
examples/heat's for any rank count (tests/parallel/test_heat_mpi.py), so "bitwise equal to
an uninterrupted 3-rank run" is checked as equal to the serial run's digest.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.hashing import array_digest
from kronos_audit.checkpoint.layout import shard_path, step_directory
from kronos_audit.checkpoint.treehash import global_digest
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project, find_project
from kronos_audit.runtime.ranks import rank_seed
from kronos_audit.supervise.protocol import PREEMPTED_EXIT, PROGRESS_ENV, Progress
from tests.helpers import recorded_once, run_cli
from tests.parallel.launch import launcher_env, mpiexec, mpirun, rank_program
from tests.replay.helpers import shared_project
from tests.runtime.test_faults import EXAMPLES, HANG_GUARD, last_json, run_plain, wait_for
from tests.supervised import supervised

pytestmark = pytest.mark.slow

HEAT_MPI = str(EXAMPLES / "heat_mpi/run.py")
GRID = ["--n", "25"]  # 25 rows: 9 + 8 + 8 on three ranks, 13 + 12 on two
SEED = 1234  # the default --seed of examples/heat and examples/heat_mpi


def heat_mpi(
    project: Project, ranks: int, *args: str, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    done = mpirun(ranks, HEAT_MPI, *GRID, *args, cwd=project.root)
    if ok:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def _heat_module() -> ModuleType:
    """examples/heat/run.py as a module: its ``init`` and ``advance``, not its ``main``."""
    spec = importlib.util.spec_from_file_location("examples_heat_run", EXAMPLES / "heat/run.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SERIAL: dict[int, dict[str, Any]] = {}
"""The serial runs' results by step count: the same in every project, so computed once each."""


def serial(steps: int) -> dict[str, Any]:
    """The final step and state digest of the serial heat example after ``steps`` steps:
    the reference a run on any number of ranks must end bitwise equal to.

    Computed in-process with examples/heat's own ``init`` and ``advance`` from the
    generator its ``ka.Run`` hands it (``rank_seed(seed, 0)`` is the seed itself), the
    same elementwise arithmetic as its ``main``: that the program itself prints this
    digest, and heat_mpi's with it, is tests/parallel/test_heat_mpi.py's claim, run there
    as a subprocess. Here it only spares a process and a checkpoint per reference."""
    if steps not in _SERIAL:
        heat = _heat_module()
        state = heat.init(int(GRID[1]), np.random.default_rng(rank_seed(SEED, 0)))
        for _ in range(steps):
            state = heat.advance(state, alpha=0.2)
        _SERIAL[steps] = {"step": int(state["iterations"]), "digest": ka.state_digest(state)}
    return _SERIAL[steps]


def step_manifest(run_dir: Path, step: int) -> ka.Manifest:
    return ka.read_manifest(step_directory(run_dir, step) / "index.jsonl.kaudit.json")


def steps_signed(run_dir: Path) -> list[int]:
    return sorted(int(p.parent.name[5:]) for p in run_dir.glob("step-*/index.jsonl.kaudit.json"))


def three_ranks_to(
    steps: int,
    templates: tuple[Path, Path],
    factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Project:
    """A project of the test's own in which examples/heat_mpi ran on 3 ranks to ``steps``,
    a step every 5, and KAUDIT_HOME the home of the key that signed it (trusted by the
    project). The launch is made once for the session (recorded_once): the tests that
    start from it change their copy, never the recording."""

    def record(into: Path) -> None:
        with pytest.MonkeyPatch.context() as mp:
            project, home = shared_project(mp, templates, factory)
            heat_mpi(project, 3, "--steps", str(steps), "--every", "5")
        shutil.move(project.root, into / "repo")
        shutil.move(home, into / "home")

    copy = recorded_once(f"heat-mpi-3-ranks-to-{steps}", factory, record)
    monkeypatch.setenv("KAUDIT_HOME", str(copy / "home"))
    return find_project(copy / "repo")


@pytest.fixture
def to_20(
    repo_templates: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Project:
    """examples/heat_mpi run on 3 ranks to step 20 (steps 5, 10, 15, 20 signed)."""
    return three_ranks_to(20, repo_templates, tmp_path_factory, monkeypatch)


@pytest.fixture
def to_10(
    repo_templates: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Project:
    """examples/heat_mpi run on 3 ranks to step 10 (steps 5 and 10 signed)."""
    return three_ranks_to(10, repo_templates, tmp_path_factory, monkeypatch)


def test_three_ranks_restarted_on_two_and_on_four_end_bitwise_the_same(to_20: Project) -> None:
    project = to_20
    reference = serial(30)
    run_dir = project.root / "checkpoints" / "heat-mpi"
    assert steps_signed(run_dir) == [5, 10, 15, 20]
    first = step_manifest(run_dir, 20)
    shards = first.record.shards
    assert shards is not None
    assert shards.count == 3
    layout = first.predicate["shards"]["layout"]
    u, time = dict(layout["fields/u"]), dict(layout["time"])
    assert (u["block"], u["shape"], u["dtype"]) == (0, (25, 25), "<f8")
    assert (time["replicated"], time["shape"], time["dtype"]) == (True, (), "<f8")
    # Replicated arrays are in rank 0's shard only; what the manifest records of each is
    # what the shards hold, read back.
    import h5py

    directory = step_directory(run_dir, 20)
    files = [h5py.File(shard_path(directory, r, 3)) for r in range(3)]
    try:
        assert "time" in files[0]
        assert "time" not in files[1]
        assert files[0]["fields/u"].shape == (9, 25)
        assert files[1]["fields/u"].shape == (8, 25)
        whole = np.concatenate([f["fields/u"][()] for f in files])
        assert u["digest"] == global_digest(whole, 0)
        assert time["digest"] == array_digest("/time", files[0]["time"][()]).sha256
    finally:
        for f in files:
            f.close()
    # What git sees of a step: the manifest and small .dvc files; the data (shards, index,
    # tree) is DVC's.
    seen = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", str(directory)],
        cwd=project.root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert sorted(Path(line).name for line in seen if line != "??") == sorted(
        [
            ".gitignore",
            "index.jsonl.dvc",
            "index.jsonl.kaudit.json",
            "index.merkle.dvc",
            *(f"rank-00000{r}-of-000003.h5.dvc" for r in range(3)),
        ]
    )

    out = last_json(heat_mpi(project, 2, "--steps", "30", "--every", "5").stdout)
    assert out == reference  # resumed from the 3-rank step 20 on two ranks, bitwise
    last = step_manifest(run_dir, 30)
    assert last.predicate["shards"]["count"] == 2
    assert (
        step_manifest(run_dir, 25)
        .predicate["parent_manifest"]
        .endswith("step-00000020/index.jsonl.kaudit.json")
    )
    # And from the 2-rank step 30 on four ranks (7 + 6 + 6 + 6 rows), on to 40.
    assert last_json(heat_mpi(project, 4, "--steps", "40", "--every", "5").stdout) == serial(40)
    # And on one rank (no launcher): it carries on the sharded run, one shard a step.
    out = run_plain(project, "heat_mpi/run.py", *GRID, "--steps", "45", "--every", "5")
    assert out == serial(45)
    assert step_manifest(run_dir, 45).predicate["shards"]["count"] == 1
    results = ka.verify(run_dir)
    assert len(results) == 9
    assert all(r.ok for r in results), [r.failures for r in results if not r.ok]


def test_a_corrupt_shard_on_one_rank_makes_every_rank_fall_back(to_20: Project) -> None:
    project = to_20
    reference = serial(30)
    run_dir = project.root / "checkpoints" / "heat-mpi"
    bad = shard_path(step_directory(run_dir, 20), 1, 3)
    data = bytearray(bad.read_bytes())
    data[-100] ^= 0xFF  # one byte of rank 1's data, flipped (a new file: DVC's cache intact)
    flipped = bad.with_name("flipped")
    flipped.write_bytes(bytes(data))
    os.replace(flipped, bad)
    done = heat_mpi(project, 3, "--steps", "30", "--every", "5")
    # Only rank 1 found it; every rank resumed from step 15 (a rank that resumed from 20
    # alone would have exchanged halos with ranks at another step: not the serial field).
    assert "step-00000020: skipped (rank 1)" in done.stderr
    assert "skipped (rank 0)" not in done.stderr
    assert "skipped (rank 2)" not in done.stderr
    assert last_json(done.stdout) == reference
    assert (
        step_manifest(run_dir, 20)
        .predicate["parent_manifest"]
        .endswith("step-00000015/index.jsonl.kaudit.json")
    )


def test_a_missing_shard_falls_back_and_kaudit_verify_names_its_rank(to_10: Project) -> None:
    project = to_10
    run_dir = project.root / "checkpoints" / "heat-mpi"
    result = run_cli("verify", str(run_dir), cwd=project.root)
    assert result.exit_code == 0, result.output
    shard_path(step_directory(run_dir, 10), 2, 3).unlink()
    # Fetching (the default) brings the shard back from DVC's cache: verify passes.
    assert run_cli("verify", str(run_dir), cwd=project.root).exit_code == 0
    shard_path(step_directory(run_dir, 10), 2, 3).unlink()
    result = run_cli("verify", "--no-fetch", str(run_dir), cwd=project.root)
    assert result.exit_code == 1, result.output
    assert "rank 2 of 3: missing" in result.output
    done = heat_mpi(project, 3, "--steps", "12", "--every", "5")
    assert "skipped (rank 2)" in done.stderr
    assert last_json(done.stdout) == serial(12)
    # Step 10 was done again (from step 5) and is whole: the shard is back, verify passes.
    assert shard_path(step_directory(run_dir, 10), 2, 3).is_file()
    assert run_cli("verify", "--no-fetch", str(run_dir), cwd=project.root).exit_code == 0


WRAPPER = """
import os, runpy, sys
# Test only: each rank says where it is, then runs the program unchanged.
rank = os.environ["OMPI_COMM_WORLD_RANK"]
pids = os.environ["KAUDIT_TEST_PIDS"]
with open(os.path.join(pids, f"rank-{rank}.pid.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(pids, f"rank-{rank}.pid.tmp"), os.path.join(pids, f"rank-{rank}.pid"))
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


def _wrapper(project: Project) -> tuple[Path, dict[str, str]]:
    wrapper = project.root / "ranked.py"
    wrapper.write_text(textwrap.dedent(WRAPPER))
    pids = project.root / "pids"
    pids.mkdir()
    env = {**launcher_env(), "KAUDIT_TEST_PIDS": str(pids)}
    return wrapper, env


def _pid(pids: Path, rank: int) -> int:
    return int((pids / f"rank-{rank}.pid").read_text())


@pytest.mark.parametrize("victim", [0, 2])  # rank 0 decides at that call, others one later
def test_sigusr1_on_one_rank_checkpoints_every_rank_at_one_step_and_exits_75(
    project: Project, key: SigningKey, victim: int
) -> None:
    wrapper, env = _wrapper(project)
    progress_file = project.root / "progress.bin"
    progress = Progress(progress_file)
    env[PROGRESS_ENV] = str(progress_file)
    proc = subprocess.Popen(
        mpiexec(3, str(wrapper), HEAT_MPI, *GRID, "--steps", "10000000", "--every", "1000000"),
        cwd=project.root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids = project.root / "pids"
    try:
        wait_for(lambda: progress.read()[0] >= 20, "twenty steps")
        os.kill(_pid(pids, victim), signal.SIGUSR1)
        _stdout, stderr = proc.communicate(timeout=HANG_GUARD)
    finally:
        proc.kill()
    assert proc.returncode == PREEMPTED_EXIT, stderr
    run_dir = project.root / "checkpoints" / "heat-mpi"
    (saved,) = steps_signed(run_dir)
    assert saved >= 20
    assert step_manifest(run_dir, saved).predicate["shards"]["count"] == 3
    results = ka.verify(run_dir)
    assert all(r.ok for r in results), [r.failures for r in results if not r.ok]
    # It resumes there, bitwise.
    done = heat_mpi(project, 3, "--steps", str(saved + 3), "--every", "1000000")
    assert last_json(done.stdout) == serial(saved + 3)


def test_one_rank_sigkilled_under_kaudit_run_completes_bitwise(
    project: Project, key: SigningKey
) -> None:
    wrapper, env = _wrapper(project)
    steps = 200  # the kill lands after step 20: some 18 checkpoints before the run would end
    reference = serial(steps)
    run_dir = project.root / "checkpoints" / "heat-mpi"
    supervisor = supervised(
        HEAT_MPI,
        *GRID,
        *("--steps", str(steps), "--every", "10"),
        cwd=project.root,
        retries=5,
        launcher=mpiexec(3, str(wrapper)),
        env=env,
    )
    pids = project.root / "pids"
    try:
        wait_for(lambda: len(steps_signed(run_dir)) >= 2, "two checkpoints")
        victim = _pid(pids, 1)
        os.kill(victim, signal.SIGKILL)
        stdout, stderr = supervisor.communicate(timeout=HANG_GUARD)
    finally:
        supervisor.kill()
    assert supervisor.returncode == 0, stderr
    assert _pid(pids, 1) != victim  # mpiexec was started again
    assert last_json(stdout) == reference
    final = step_manifest(run_dir, steps)
    assert final.predicate["restart_count"] >= 1
    results = ka.verify(run_dir)
    assert all(r.ok for r in results), [r.failures for r in results if not r.ok]


def test_ranks_out_of_step_and_a_bad_layout_are_one_line_errors(
    project: Project, key: SigningKey
) -> None:
    program = rank_program(
        """
        import sys
        import numpy as np
        import kronos_audit as ka
        with ka.Run("bad", seed=1, every=ka.EverySteps(1)) as run:
            for step in run.steps(3):
                state = {"u": np.zeros((2, 3))}
                if sys.argv[1] == "layout":
                    run.checkpoint(step, state, layout={"v": ka.Block(axis=0)})
                else:
                    run.checkpoint(step + run.rank, state)
    """,
        at=project.root / "bad.py",
    )
    for case, message in (
        ("layout", "layout['v']: no such key in the state"),
        ("step", "ranks are out of step"),
    ):
        done = program.launch(2, case)
        assert done.returncode != 0
        assert message in done.stderr, done.stderr
    assert not list((project.root / "checkpoints" / "bad").glob("step-*/*.kaudit.json"))


API_PROGRAM = """
import sys
import numpy as np
import kronos_audit as ka
from kronos_audit.parallel.layout import local_block

def field(step):
    return np.arange(14.0).reshape(7, 2) + step

mode = sys.argv[1]
out = {}
with ka.Run("api", seed=5, every=ka.EverySteps(2)) as run:
    out["rank"] = run.rank
    try:
        state = run.restore()
    except ka.CheckpointError as e:
        out["error"] = str(e)
        state = None
    if mode == "write":
        for step in run.steps(6):
            u = local_block(field(step), ka.Block(0), run.size, run.rank)
            state = {"u": u, "c": np.float64(step), "own": np.array([run.rank])}
            run.checkpoint(step, state, layout={"u": ka.Block(axis=0), "c": ka.Replicated()})
    elif mode == "inspect":
        out["all"] = run.all_steps()
        out["latest"] = run.latest_step()
        out["at4"] = run.restore(step=4)["u"].tolist()
        out["c"] = float(state["c"])
        out["own"] = state["own"].tolist()
        out["step"] = run.step
        try:  # the restored step again: every rank refuses it, together
            run.checkpoint(6, state)
        except ka.StepAlreadyExists as e:
            out["stale"] = [e.step, e.newest]
"""


def test_steps_latest_and_an_older_step_on_every_rank_and_a_key_without_layout(
    project: Project, key: SigningKey
) -> None:
    program = rank_program(API_PROGRAM, at=project.root / "api.py")
    program.outputs(3, "write")
    for r, doc in enumerate(program.outputs(3, "inspect")):
        assert doc["all"] == [2, 4, 6]
        assert doc["latest"] == 6
        assert doc["step"] == 6
        assert doc["c"] == 6.0
        assert doc["own"] == [r]
        assert doc["stale"] == [6, 6]
        rows = [(0, 3), (3, 5), (5, 7)][r]
        assert doc["at4"] == (np.arange(14.0).reshape(7, 2) + 4)[rows[0] : rows[1]].tolist()
    # "own" has no layout: on 2 ranks every rank refuses the restore, naming it.
    for doc in program.outputs(2, "recount"):
        assert "own: has no layout" in doc["error"]
        assert "only on the 3 ranks that wrote it, not on 2" in doc["error"]


FAILING_WRITE = """
import resource, signal, sys
import numpy as np
import kronos_audit as ka

with ka.Run("torn", seed=1, every=ka.EverySteps(2)) as run:
    if run.rank == 1 and sys.argv[1] == "fail":
        # A real write failure on one rank only: its files may not grow past 64 KiB
        # (EFBIG from write(), the signal that would kill it ignored).
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
    state = run.restore()
    print("restored", run.rank, run.step, flush=True)
    for step in run.steps(int(sys.argv[2])):
        state = {"u": np.full(20_000, float(step))}  # 160 kB a rank
        run.checkpoint(step, state)
"""


def test_a_shard_that_cannot_be_written_on_one_rank_aborts_the_step_on_every_rank(
    project: Project, key: SigningKey
) -> None:
    program = rank_program(FAILING_WRITE, at=project.root / "torn.py")

    def launch_torn(*args: str, tagged: bool = False) -> subprocess.CompletedProcess[str]:
        # tagged: each line of output begins with the rank that wrote it, "[job,rank]<...>: "
        return program.launch(3, *args, options=["--output", "tag"] if tagged else [])

    run_dir = project.root / "checkpoints" / "torn"
    assert launch_torn("ok", "2").returncode == 0
    assert steps_signed(run_dir) == [2]
    done = launch_torn("fail", "6", tagged=True)
    assert done.returncode != 0
    # Every rank heard the abort and named the rank whose shard is not durable (once or,
    # where the background write's failure is also noted on the way out, twice).
    named = {
        line.split("]", 1)[0]
        for line in done.stderr.splitlines()
        if "the checkpoint of step 4 was not committed: rank 1:" in line
    }
    assert named == {f"[1,{r}" for r in range(3)}, done.stderr
    assert steps_signed(run_dir) == [2]  # no manifest for step 4: never a valid step
    assert not list(run_dir.glob("step-00000004/*.dvc"))  # nor tracked
    again = launch_torn("ok", "6")
    assert again.returncode == 0, again.stderr
    assert sorted(again.stdout.split("\n")[:3]) == [f"restored {r} 2" for r in range(3)]
    assert steps_signed(run_dir) == [2, 4, 6]


TIMED = """
import time
import numpy as np
import kronos_audit as ka

with ka.Run("timed", seed=1, every=ka.EverySeconds(0.05)) as run:
    run.restore()
    for step in run.steps(40):
        time.sleep(0.004 * (run.rank + 1))  # each rank's clock sees another pace
        run.checkpoint(step, {"u": np.full(3, float(step))})
"""


def test_a_time_based_policy_decides_once_for_every_rank(project: Project, key: SigningKey) -> None:
    import h5py

    done = rank_program(TIMED, at=project.root / "timed.py").launch(3)
    assert done.returncode == 0, done.stderr
    run_dir = project.root / "checkpoints" / "timed"
    steps = steps_signed(run_dir)
    assert len(steps) >= 2
    assert steps[-1] == 40  # and the final step
    for step in steps:  # every shard of a step holds that step's state: none is torn
        for r in range(3):
            with h5py.File(shard_path(step_directory(run_dir, step), r, 3)) as f:
                assert f["u"][0] == step


SERIALIZED = """
import sys
import mpi4py

mpi4py.rc.thread_level = "serialized"  # the program's choice, before MPI starts
import numpy as np
import kronos_audit as ka

try:
    background = sys.argv[1] == "async"
    with ka.Run("serial", seed=1, every=ka.EverySteps(1), asynchronous=background) as run:
        for step in run.steps(2):
            run.checkpoint(step, {"u": np.zeros(2)})
except ka.UsageError as e:
    print("refused:", e)
else:
    print("done", run.rank)
"""


def test_background_commits_need_mpi_thread_multiple_and_synchronous_ones_do_not(
    project: Project, key: SigningKey
) -> None:
    program = rank_program(SERIALIZED, at=project.root / "serialized.py")

    def launch_it(mode: str) -> str:
        done = program.launch(2, mode)
        assert done.returncode == 0, done.stderr
        return done.stdout

    out = launch_it("async")
    # Every rank refuses (rank 1 naming rank 0, the first that found it), before any file.
    assert out.count("refused: ") == 2, out
    assert out.count("MPI was initialized without MPI_THREAD_MULTIPLE") == 2, out
    assert not (project.root / "checkpoints" / "serial").exists()
    assert sorted(launch_it("sync").split()) == ["0", "1", "done", "done"]
    assert steps_signed(project.root / "checkpoints" / "serial") == [1, 2]


NOT_A_SPLIT = """
import numpy as np
import kronos_audit as ka

with ka.Run("split", seed=1, every=ka.EverySteps(1)) as run:
    for step in run.steps(1):
        # 1, 2 and 3 rows: array_split puts the longer blocks first, so this is no split.
        u = np.zeros((run.rank + 1, 2))
        run.checkpoint(step, {"u": u}, layout={"u": ka.Block(axis=0)})
"""


def test_blocks_that_are_not_an_array_split_abort_the_step_naming_the_array(
    project: Project, key: SigningKey
) -> None:
    done = rank_program(NOT_A_SPLIT, at=project.root / "split.py").launch(3)
    assert done.returncode != 0
    assert (
        done.stderr.count(
            "the checkpoint of step 1 was not committed: u: rank 0 of 3: local shape (1, 2) "
            "is not its block of an array_split of (6, 2) along axis 0"
        )
        == 3
    ), done.stderr
    assert steps_signed(project.root / "checkpoints" / "split") == []


def test_a_corrupt_step_redone_on_another_rank_count_leaves_only_its_own_shards(
    to_10: Project,
) -> None:
    project = to_10
    run_dir = project.root / "checkpoints" / "heat-mpi"
    bad = shard_path(step_directory(run_dir, 10), 1, 3)
    data = bytearray(bad.read_bytes())
    data[-100] ^= 0xFF
    flipped = bad.with_name("flipped")
    flipped.write_bytes(bytes(data))
    os.replace(flipped, bad)
    done = heat_mpi(project, 2, "--steps", "10", "--every", "5")
    assert "step-00000010: skipped" in done.stderr  # back to step 5, step 10 redone on 2
    assert last_json(done.stdout) == serial(10)
    names = sorted(p.name for p in step_directory(run_dir, 10).glob("rank-*"))
    assert names == [
        "rank-000000-of-000002.h5",
        "rank-000000-of-000002.h5.dvc",
        "rank-000001-of-000002.h5",
        "rank-000001-of-000002.h5.dvc",
    ]
    results = ka.verify(run_dir)
    assert all(r.ok for r in results), [r.failures for r in results if not r.ok]


GROW = """
import numpy as np
import kronos_audit as ka
from kronos_audit.parallel.layout import local_block

with ka.Run("grow", seed=9, every=ka.EverySteps(2)) as run:
    state = run.restore()
    out = {"rank": run.rank, "step": run.step, "draw": float(run.rng.random())}
    if state is None:
        for step in run.steps(2):
            u = local_block(np.arange(6.0), ka.Block(0), run.size, run.rank)
            run.checkpoint(step, {"u": u}, layout={"u": ka.Block(axis=0)})
    else:
        out["u"] = state["u"].tolist()
"""


def test_generators_come_back_per_rank_and_a_joining_rank_gets_a_fresh_stream(
    project: Project, key: SigningKey
) -> None:
    from kronos_audit.runtime.ranks import joining_seed

    program = rank_program(GROW, at=project.root / "grow.py")
    first = program.outputs(2)
    assert [d["draw"] for d in first] == [
        np.random.default_rng(rank_seed(9, r)).random() for r in range(2)
    ]
    again = program.outputs(3)
    assert [d["step"] for d in again] == [2, 2, 2]
    assert [d["u"] for d in again] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    for r in range(2):  # ranks 0 and 1: their own generators, as saved (after one draw)
        g = np.random.default_rng(rank_seed(9, r))
        g.random()
        assert again[r]["draw"] == g.random()
    # Rank 2 had none saved: a stream for (seed, rank 2, step 2), not rank 2's from step 0.
    assert again[2]["draw"] == np.random.default_rng(joining_seed(9, 2, 2)).random()
    assert again[2]["draw"] != np.random.default_rng(rank_seed(9, 2)).random()


ALONE = """
import sys
import numpy as np
import kronos_audit as ka

with ka.Run("alone", seed=1, every=ka.EverySteps(2)) as run:
    run.restore()
    for step in run.steps(40):
        if run.rank == 1 and step == 3:
            raise ValueError("rank 1's own bug")  # the others go on into the next collective
        run.checkpoint(step, {"u": np.full(8, float(step))})
"""


def test_an_error_on_one_rank_alone_takes_the_job_down_instead_of_hanging_it(
    project: Project, key: SigningKey
) -> None:
    program = rank_program(ALONE, at=project.root / "alone.py")
    # Unless the error takes the job down, ranks 0 and 2 wait here for ever (the hang guard).
    done = program.launch(3)
    assert done.returncode != 0
    assert "ValueError: rank 1's own bug" in done.stderr  # its traceback, printed first
    assert done.stderr.count("ValueError: rank 1's own bug") == 1
