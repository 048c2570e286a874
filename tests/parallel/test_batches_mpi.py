"""Monte Carlo batches spread over the ranks under a real mpiexec: each batch runs on one
rank, the ledger is gathered at each commit and rank 0 writes the round's batches as one
chunk beside the steps, a rank SIGKILLed mid-run costs only its
uncommitted batches, re-run on another rank count, and the tally is a serial run's, bit
for bit, on every rank.

The program records which rank ran which batch; the serial reference is the same program
run as one process (no launcher).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.layout import shard_path, step_directory
from kronos_audit.checkpoint.ledger import chunk_path
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from tests.helpers import recorded_once, run_cli
from tests.parallel import launch
from tests.parallel.launch import launcher_env, mpiexec, mpirun
from tests.replay.helpers import commit_all, shared_project
from tests.runtime.test_faults import EXAMPLES, HANG_GUARD, last_json, run_plain
from tests.signing.test_writer_lock import trusted

pytestmark = pytest.mark.slow

MC = """
import json
import os
import random
import signal
import sys
from pathlib import Path

import numpy as np

import kronos_audit as ka

run_id, n = sys.argv[1], int(sys.argv[2])
shuffle = int(sys.argv[3]) if len(sys.argv) > 3 else None
kill = os.environ.get("MC_KILL")  # "<rank>:<k>": that rank dies before its batch k + 1


def add(a, b):
    return {k: a[k] + b[k] for k in a}


with ka.Run(run_id, seed=7, every=ka.EverySteps(1)) as run:
    run.restore()
    restored = run.ledger.indices()
    todo = list(run.batches(n))
    if shuffle is not None:
        random.Random(shuffle + run.rank).shuffle(todo)
    ran = []
    for i, rng in todo:
        if kill == f"{run.rank}:{len(ran)}":
            run.wait()  # the rounds before are committed, on every rank
            os.kill(os.getpid(), signal.SIGKILL)
        run.record(i, {"x": rng.standard_normal(2000).sum(), "h": rng.integers(0, 9, 4)})
        ran.append(i)
        run.checkpoint(i, {})
    tally = run.ledger.reduce(add)
Path(f"out.{run.rank}.json").write_text(
    json.dumps(
        {
            "rank": run.rank,
            "restored": restored,
            "ran": ran,
            "ledger": run.ledger.indices(),
            "x": float(tally["x"]).hex(),
            "digest": ka.state_digest(tally),
        }
    )
)
"""


def program(project: Project) -> str:
    path = project.root / "mc.py"
    path.write_text(textwrap.dedent(MC))
    return str(path)


def outputs(cwd: Path, size: int) -> list[dict[str, Any]]:
    """Each rank's JSON, the files removed for the next launch."""
    docs = launch.per_rank(cwd, size)
    for f in cwd.glob("out.*.json"):
        f.unlink()
    return docs


@pytest.fixture
def serial(
    repo_templates: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[int], dict[str, Any]]:
    """The tally of the program run on ``n`` batches as one process, no launcher: the
    reference. The same in every project (the batches' generators are the seed's and the
    batch's alone), so each ``n`` is run once for the session, in a project of its own."""

    def reference(n: int) -> dict[str, Any]:
        def record(into: Path) -> None:
            with pytest.MonkeyPatch.context() as mp:
                project, _home = shared_project(mp, repo_templates, tmp_path_factory)
                subprocess.run(
                    [sys.executable, program(project), "serial", str(n)],
                    cwd=project.root,
                    check=True,
                    timeout=HANG_GUARD,
                )
                (doc,) = outputs(project.root, 1)
            tally = {"x": doc["x"], "digest": doc["digest"]}
            (into / "tally.json").write_text(json.dumps(tally), encoding="utf-8")

        copy = recorded_once(f"batches-serial-{n}", tmp_path_factory, record)
        tally: dict[str, Any] = json.loads((copy / "tally.json").read_text(encoding="utf-8"))
        return tally

    return reference


def mc(project: Project, ranks: int, *args: str) -> list[dict[str, Any]]:
    done = mpirun(ranks, program(project), *args, cwd=project.root)
    assert done.returncode == 0, done.stdout + done.stderr
    return outputs(project.root, ranks)


def tallies(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"x": d["x"], "digest": d["digest"]} for d in docs]


def signed_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.parent.name[5:]) for p in run_dir.glob("step-*/index.jsonl.kaudit.json"))


def ledger_of(run_dir: Path, step: int) -> list[int]:
    """The batches of step ``step``'s ledger: in the chunks beside the steps its manifest
    names, rank 0's (no shard holds the ledger)."""
    manifest = ka.read_manifest(step_directory(run_dir, step) / "index.jsonl.kaudit.json")
    indices: list[int] = []
    for chunk in manifest.record.ledger:
        with h5py.File(chunk_path(run_dir, chunk.sha256)) as f:
            indices += [int(i) for i in f["ledger/index"][()]]
    return sorted(indices)


def shard_holds_ledger(run_dir: Path, step: int, rank: int, count: int) -> bool:
    with h5py.File(shard_path(step_directory(run_dir, step), rank, count)) as f:
        return "ledger" in f


def test_ten_batches_on_three_ranks_run_once_each_and_tally_as_one_process(
    project: Project, key: SigningKey, serial: Callable[[int], dict[str, Any]]
) -> None:
    reference = serial(10)
    docs = mc(project, 3, "spread", "10")
    # Dealt round-robin, 4 + 3 + 3: each batch ran once, on one rank.
    assert [d["ran"] for d in docs] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    # Every rank ends with every rank's results, and the serial tally, bit for bit.
    assert [d["ledger"] for d in docs] == [list(range(10))] * 3
    assert tallies(docs) == [reference] * 3
    run_dir = project.root / "checkpoints" / "spread"
    # One step a round (EverySteps(1)), each the batches done on every rank by then.
    assert signed_steps(run_dir) == [3, 6, 9, 10]
    # Rank 0 wrote each round's batches, every rank's, as one chunk the step names.
    assert ledger_of(run_dir, 6) == list(range(6))
    chunks = ka.read_manifest(step_directory(run_dir, 6) / "index.jsonl.kaudit.json")
    assert [(c.first, c.count) for c in chunks.record.ledger] == [(0, 3), (3, 3)]
    assert not any(shard_holds_ledger(run_dir, 6, r, 3) for r in range(3))
    manifest = ka.read_manifest(step_directory(run_dir, 10) / "index.jsonl.kaudit.json")
    assert manifest.predicate["batches"]["total"] == manifest.predicate["batches"]["done"] == 10
    # Rank 0 signs where each batch ran: each once along the chain, by its own rank.
    worker_of: dict[int, str] = {}
    for step in signed_steps(run_dir):
        m = ka.read_manifest(step_directory(run_dir, step) / "index.jsonl.kaudit.json")
        for ran in m.record.batches.ran:  # type: ignore[union-attr]
            for i in ran.indices():
                assert i not in worker_of
                worker_of[i] = ran.worker
    assert sorted(worker_of) == list(range(10))
    by_rank = [{worker_of[i] for i in d["ran"]} for d in docs]
    assert all(len(w) == 1 for w in by_rank)
    assert len(set.union(*by_rank)) == 3


def test_a_rank_sigkilled_mid_run_costs_only_its_uncommitted_batches_on_two_ranks(
    project: Project,
    key: SigningKey,
    tmp_path: Path,
    serial: Callable[[int], dict[str, Any]],
) -> None:
    reference = serial(12)
    run_dir = project.root / "checkpoints" / "killed"
    env = launcher_env()
    env["MC_KILL"] = "1:2"  # rank 1, before its third batch: rounds 1 and 2 are committed
    killed = subprocess.run(
        mpiexec(3, program(project), "killed", "12"),
        cwd=project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert killed.returncode != 0, killed.stdout + killed.stderr
    assert not list(project.root.glob("out.*.json"))  # no rank got to the end
    assert signed_steps(run_dir)[-1] == 6
    committed = ledger_of(run_dir, 6)
    assert committed == list(range(6))

    docs = mc(project, 2, "killed", "12")
    assert [d["restored"] for d in docs] == [committed] * 2  # the union, on either rank
    # Only the batches not committed ran again, each once, dealt over the two ranks.
    assert [d["ran"] for d in docs] == [[6, 8, 10], [7, 9, 11]]
    assert [d["ledger"] for d in docs] == [list(range(12))] * 2
    assert tallies(docs) == [reference] * 2
    assert signed_steps(run_dir)[-1] == 12
    verified = run_cli("verify", str(run_dir), "--trusted-key", str(trusted(tmp_path, key)))
    assert verified.exit_code == 0, verified.output


def test_a_shuffled_order_and_a_rank_left_without_batches_tally_as_one_process(
    project: Project, key: SigningKey, serial: Callable[[int], dict[str, Any]]
) -> None:
    reference = serial(10)
    docs = mc(project, 3, "shuffled", "10", "5")
    assert sorted(i for d in docs for i in d["ran"]) == list(range(10))
    assert [sorted(d["ran"]) for d in docs] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert [d["ran"] for d in docs] != [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]  # shuffled
    assert tallies(docs) == [reference] * 3
    # Two batches more on four ranks: ranks 2 and 3 have none, and keep in step all the
    # same; rank 3, which no shard was written by, restores the union from rank 0's.
    more = mc(project, 4, "shuffled", "12", "5")
    assert [d["restored"] for d in more] == [list(range(10))] * 4
    assert [d["ran"] for d in more] == [[10], [11], [], []]
    assert [d["ledger"] for d in more] == [list(range(12))] * 4
    assert tallies(more) == [serial(12)] * 4
    assert signed_steps(project.root / "checkpoints" / "shuffled")[-1] == 12


def test_the_montecarlo_example_on_three_ranks_prints_the_one_process_tally(
    project: Project, key: SigningKey
) -> None:
    args = ["--batches", "7", "--samples", "5000", "--shuffle", "3"]
    plain = run_plain(project, "montecarlo/run.py", *args, "--run-id", "plain")
    done = mpirun(
        3, str(EXAMPLES / "montecarlo/run.py"), *args, "--run-id", "spread", cwd=project.root
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count('"digest"') == 1  # rank 0's line
    assert last_json(done.stdout) == plain


def test_a_step_of_batches_on_three_ranks_replays_bitwise(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in launcher_env().items():
        if name.startswith("OMPI_ALLOW") or name == "PYTHONUNBUFFERED":
            monkeypatch.setenv(name, value)
    program(project)
    commit_all(project.root, "the program")
    mc(project, 3, "replayed", "10")
    run_dir = project.root / "checkpoints" / "replayed"
    for step in (6, 10):  # a round of three, and the last, of one batch on rank 0
        manifest = step_directory(run_dir, step) / "index.jsonl.kaudit.json"
        shown = run_cli("replay", str(manifest), "--json")
        assert shown.exit_code == 0, shown.output
        doc = json.loads(shown.stdout)
        assert doc["outcome"] == "REPRODUCED", doc
        verdicts = {d["path"]: d["verdict"] for d in doc["datasets"]}
        # The chunk of the ledger step N wrote (rank 0's, of every rank's batches since
        # its parent) is compared too, bitwise: no shard holds the ledger.
        assert verdicts["/ledger"] == "IDENTICAL", sorted(verdicts)
        assert not [p for p in verdicts if p.startswith("/ledger/")], sorted(verdicts)


POACH = """
import kronos_audit as ka

with ka.Run("poach", seed=1, every=ka.EverySteps(1)) as run:
    run.restore()
    for i, rng in run.batches(4):
        run.record(0 if run.rank == 1 else i, rng.random())  # rank 1 takes rank 0's batch
        run.checkpoint(i, {})
"""


def test_recording_another_ranks_batch_is_refused_naming_both(
    project: Project, key: SigningKey
) -> None:
    path = project.root / "poach.py"
    path.write_text(textwrap.dedent(POACH))
    done = mpirun(2, str(path), cwd=project.root)
    assert done.returncode != 0
    assert "batch 0 is rank 0's in this run" in done.stderr, done.stderr
    assert "rank 1 may record only its own" in done.stderr
