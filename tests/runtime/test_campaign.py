"""run.map_batches on the engines users run, with the faults injected for real: a pool
worker killed with SIGKILL (BrokenProcessPool), a Dask worker process killed mid-campaign,
and the restart under `kaudit run`. Every tally is bitwise a serial run's."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.project.repository import Project
from kronos_audit.runtime.campaigns.ledger import batch_rng
from tests.helpers import KAUDIT

SEED = 2024
HANG_GUARD = 60  # seconds; only stops a broken test from hanging, never a time limit
N = 24


def batch(rng: np.random.Generator, samples: int, marks: str | None = None) -> dict[str, Any]:
    """A batch of the pi example's kind; with ``marks``, each run leaves a file there."""
    if marks is not None:
        Path(marks, f"{rng.bit_generator.seed_seq.spawn_key[0]}.{os.getpid()}").touch()  # type: ignore[attr-defined]
    x, y = rng.random(samples), rng.random(samples)
    return {"hits": np.int64((x * x + y * y <= 1.0).sum()), "r2": np.float64((x * x).sum())}


def add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {k: a[k] + b[k] for k in a}


def serial_tally(n: int = N, samples: int = 500) -> dict[str, Any]:
    """The tally of a serial run: every batch in index order, in this process."""
    results = [batch(batch_rng(SEED, i), samples) for i in range(n)]
    tally = results[0]
    for r in results[1:]:
        tally = add(tally, r)
    return tally


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes() for k in a
    )


def campaign(project: Project, run_id: str, executor: Any, **kwargs: Any) -> dict[str, Any]:
    with ka.Run(
        run_id, root=project.root / "checkpoints", seed=SEED, every=ka.EverySteps(5)
    ) as run:
        run.restore()
        ledger = run.map_batches(batch, N, executor=executor, samples=500, **kwargs)
        tally: dict[str, Any] = ledger.reduce(add)
        return tally


def test_in_this_process_threads_and_processes_give_the_serial_tally(
    project: Project, key: ka.SigningKey
) -> None:
    expected = serial_tally()
    assert same(campaign(project, "here", None), expected)
    with cf.ThreadPoolExecutor(3) as pool:
        assert same(campaign(project, "threads", pool), expected)
    with cf.ProcessPoolExecutor(2) as pool:
        assert same(campaign(project, "processes", pool), expected)
    # A finished campaign restarted runs nothing, and its ledger is the same.
    with cf.ProcessPoolExecutor(1) as pool:
        pool.shutdown()  # a submit would fail: nothing may be submitted
        assert same(campaign(project, "processes", pool), expected)


def test_an_object_without_submit_is_one_usage_error(project: Project, key: ka.SigningKey) -> None:
    with (
        ka.Run("r", root=project.root / "checkpoints", seed=1) as run,
        pytest.raises(ka.UsageError) as e,
    ):
        run.map_batches(batch, 3, executor=object(), samples=1)  # type: ignore[arg-type]
    assert "submit" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_batch_that_raises_stops_the_campaign_keeping_what_arrived(
    project: Project, key: ka.SigningKey
) -> None:
    def bad(rng: np.random.Generator, samples: int) -> dict[str, Any]:
        if rng.bit_generator.seed_seq.spawn_key[0] == 7:  # type: ignore[attr-defined]
            raise ValueError("no such thing\nsecond line")
        return batch(rng, samples)

    with (
        ka.Run("r", root=project.root / "checkpoints", seed=SEED, every=ka.Never()) as run,
        pytest.raises(ka.CampaignError) as e,
    ):
        run.map_batches(bad, N, samples=500)
    said = str(e.value)
    assert said.startswith("the campaign stopped: batch 7: ValueError: no such thing;")
    assert "7 of 24 batches are recorded and checkpointed" in said
    assert "\n" not in said
    # The policy took none, but the seven results are durable: a restart runs the rest.
    with ka.Run("r", root=project.root / "checkpoints", seed=SEED, every=ka.Never()) as run:
        assert run.restore() is not None
        assert len(run.ledger) == 7
        tally = run.map_batches(batch, N, samples=500).reduce(add)
    assert same(tally, serial_tally())


PROGRAM = """
import concurrent.futures as cf, json, os, signal, sys
from pathlib import Path
import kronos_audit as ka
from tests.runtime.test_campaign import N, SEED, add, batch

marks = sys.argv[1]


def killer(rng, samples, marks):
    # The first attempt's pool loses a worker, killed for real, at batch 10.
    if rng.bit_generator.seed_seq.spawn_key[0] == 10 and not Path(marks, "killed").exists():
        Path(marks, "killed").touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return batch(rng, samples, marks)


with ka.Run("pool", seed=SEED, every=ka.EverySteps(1)) as run:
    run.restore()
    with cf.ProcessPoolExecutor(2) as pool:
        tally = run.map_batches(killer, N, executor=pool, samples=500, marks=marks).reduce(add)
print(json.dumps({k: float(v) for k, v in tally.items()}))
"""


def under_kaudit_run(
    argv: list[str], cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``argv`` supervised by the installed `kaudit run`, restarted up to twice, with the
    repository's tests importable (the programs take their batch from here)."""
    env = {**env, "PYTHONPATH": str(Path(__file__).parents[2])}
    return subprocess.run(
        [*KAUDIT, "run", "--retries", "2", "--backoff", "0", "--", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )


def test_a_killed_pool_worker_under_kaudit_run_reruns_only_the_missing_batches(
    project: Project, key: ka.SigningKey, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    (project.root / "prog.py").write_text(textwrap.dedent(PROGRAM))
    done = under_kaudit_run([sys.executable, "prog.py", str(marks)], project.root, dict(os.environ))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the campaign stopped: BrokenProcessPool" in done.stderr
    assert "attempt 2" in done.stderr
    tally = json.loads(done.stdout.strip().splitlines()[-1])
    assert tally == {k: float(v) for k, v in serial_tally().items()}
    runs: dict[int, int] = {}
    for mark in marks.glob("*.*"):
        index = int(mark.name.split(".")[0])
        runs[index] = runs.get(index, 0) + 1
    assert sorted(runs) == list(range(N))
    # Only the batches in flight when the pool broke ran twice: at most the pool's two
    # workers' worth beyond those recorded, never the whole campaign again.
    assert sum(runs.values()) - N <= 4, runs


def test_a_dask_worker_killed_mid_campaign_is_rescheduled_and_every_batch_recorded_once(
    project: Project, key: ka.SigningKey, tmp_path: Path
) -> None:
    distributed = pytest.importorskip("distributed")
    marks = tmp_path / "marks"
    marks.mkdir()
    # dask's HTTP server on a free port: on its default, 8787, another test's cluster
    # makes dask warn, and a warning fails the test
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        tally = _dask_campaign(project, client, marks)
    assert same(tally, serial_tally())
    assert (marks / "killed").exists()


def _kill_once(rng: np.random.Generator, samples: int, marks: str) -> dict[str, Any]:
    if rng.bit_generator.seed_seq.spawn_key[0] == 5 and not Path(marks, "killed").exists():  # type: ignore[attr-defined]
        Path(marks, "killed").touch()
        os.kill(os.getpid(), signal.SIGKILL)  # the worker process, for real
    return batch(rng, samples)


def _dask_campaign(project: Project, client: Any, marks: Path) -> dict[str, Any]:
    with ka.Run(
        "dask", root=project.root / "checkpoints", seed=SEED, every=ka.EverySteps(5)
    ) as run:
        run.restore()
        ledger = run.map_batches(
            _kill_once, N, executor=client.get_executor(), samples=500, marks=str(marks)
        )
        assert ledger.indices() == list(range(N))
        tally: dict[str, Any] = ledger.reduce(add)
        return tally


def _raises_at_7(rng: np.random.Generator, samples: int) -> dict[str, Any]:
    if rng.bit_generator.seed_seq.spawn_key[0] == 7:  # type: ignore[attr-defined]
        raise ValueError("the detector returned no data")
    return batch(rng, samples)


def test_a_dask_client_itself_serves_and_a_failing_batch_stops_the_campaign(
    project: Project, key: ka.SigningKey
) -> None:
    """The client, not only its executor, is an engine; a batch that raises on a worker
    stops the campaign with one line naming it, what arrived before checkpointed."""
    distributed = pytest.importorskip("distributed")
    # dask's HTTP server on a free port: on its default, 8787, another test's cluster
    # makes dask warn, and a warning fails the test
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        assert same(campaign(project, "client", client), serial_tally())
        with ka.Run("fails", root=project.root / "checkpoints", seed=SEED) as run:
            with pytest.raises(ka.CampaignError, match=r"batch 7: ValueError: the detector"):
                run.map_batches(_raises_at_7, N, executor=client, samples=500)
            assert 7 not in run.ledger
            assert run.step == len(run.ledger)  # what arrived is checkpointed


def _kills_the_scheduler(rng: np.random.Generator, samples: int, scheduler: int) -> Any:
    if rng.bit_generator.seed_seq.spawn_key[0] == 10:  # type: ignore[attr-defined]
        os.kill(scheduler, signal.SIGKILL)  # the scheduler's process, for real
        time.sleep(HANG_GUARD)  # never reports: its worker is cut off (and ended) too
    return batch(rng, samples)


@contextlib.contextmanager
def _dask_process(*args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m distributed.cli.ARGS`` as a process of its own, killed on leaving."""
    # A worker imports this module to run a batch: from this checkout.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with subprocess.Popen(
        [sys.executable, "-m", f"distributed.cli.{args[0]}", *args[1:], "--no-dashboard"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as proc:
        try:
            yield proc
        finally:
            proc.kill()


def test_a_lost_dask_scheduler_is_the_engines_failure_not_a_batchs(
    project: Project, key: ka.SigningKey, tmp_path: Path
) -> None:
    """The scheduler's process killed with SIGKILL mid-campaign: Dask cancels every
    future; the campaign stops saying the engine was lost, blaming no batch, and what
    arrived before is checkpointed."""
    distributed = pytest.importorskip("distributed")
    where = tmp_path / "scheduler.json"
    file = ("--scheduler-file", str(where))
    with (
        _dask_process("dask_scheduler", "--port", "0", *file) as scheduler,
        _dask_process("dask_worker", "--nworkers", "1", "--nthreads", "1", *file),
    ):
        deadline = time.monotonic() + HANG_GUARD
        while not where.exists():
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.05)
        client = distributed.Client(scheduler_file=str(where), timeout=HANG_GUARD)
        try:
            client.wait_for_workers(1, timeout=HANG_GUARD)
            with ka.Run("lost", root=project.root / "checkpoints", seed=SEED) as run:
                with pytest.raises(ka.CampaignError) as stopped:
                    run.map_batches(
                        _kills_the_scheduler,
                        N,
                        executor=client,
                        samples=500,
                        scheduler=scheduler.pid,
                    )
                recorded = len(run.ledger)
                assert 10 not in run.ledger
                assert run.step == recorded  # what arrived is checkpointed
        finally:
            client.close(timeout=5)
    message = str(stopped.value)
    assert scheduler.returncode == -signal.SIGKILL
    assert message.startswith("the campaign stopped: the Dask engine was lost (client ")
    assert "no batch failed" in message
    assert re.search(r"batch \d", message) is None, message  # no batch is blamed
    assert f"{recorded} of {N} batches are recorded and checkpointed" in message


def test_a_batch_completed_twice_must_give_the_same_result(
    project: Project, key: ka.SigningKey
) -> None:
    """An engine may run a batch twice (a worker lost after it finished): the same bits
    are one record; other bits are a reproducibility failure naming the batch."""
    with ka.Run("twice", root=project.root / "checkpoints", seed=SEED) as run:
        first = batch(batch_rng(SEED, 3), 500)
        run.record(3, first, worker="a:1")
        run.record(3, dict(first), worker="b:2")  # the same bits, from elsewhere
        assert len(run.ledger) == 1
        other = {**first, "r2": first["r2"] + 1e-12}
        with pytest.raises(ka.CampaignError, match="batch 3 completed twice with different"):
            run.record(3, other)
        assert run.ledger[3]["r2"] == first["r2"]  # the first stands
        assert run.ledger.take_new()[0].worker == "a:1"
