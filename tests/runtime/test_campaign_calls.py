"""A campaign's batches go to the engine in groups, one call a group: each batch is still
recorded once, with its own result and the worker that ran it, a batch that raises in a
group is named, and a pool's workers end when their driver is killed."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.project.repository import Project
from kronos_audit.runtime.campaigns.calls import GROUP_LIMIT, groups
from kronos_audit.statement.campaign import read_certificate
from kronos_audit.verification.records import stored_batches
from tests.runtime.test_campaign import SEED, add, batch, same, serial_tally

HANG_GUARD = 120  # seconds; only stops a broken test from hanging, never a time limit


def test_groups_cover_the_batches_once_in_order_shrinking_to_one_a_call() -> None:
    todo = [i for i in range(200_000) if i % 7]  # the missing ones, not a range
    sizes = [len(g) for g in groups(todo, 2, None)]
    flat = [i for g in groups(todo, 2, None) for i in g.values]
    assert flat == todo
    assert max(sizes) == GROUP_LIMIT  # a worker lost costs at most this many
    assert sizes == sorted(sizes, reverse=True)  # the tail in small calls: every slot busy
    assert sizes[-32:] == [1] * 32
    assert len(sizes) < len(todo) // 100  # the engine's per-call cost paid rarely
    # Few batches, or many slots: one a call; a size given is kept to the last group.
    assert {len(g) for g in groups(range(24), 2, None)} == {1}
    assert {len(g) for g in groups(range(10_000), 1_000, None)} == {1}
    assert [len(g) for g in groups(range(12), 2, 5)] == [5, 5, 2]


def test_grouped_calls_on_a_pool_record_each_batch_once_and_name_the_batch_that_raised(
    project: Project, key: ka.SigningKey
) -> None:
    root = project.root / "checkpoints"
    with cf.ProcessPoolExecutor(2) as pool:
        with ka.Run("grouped", root=root, seed=SEED, every=ka.EverySteps(5)) as run:
            ledger = run.map_batches(batch, 24, executor=pool, per_call=5, samples=500)
            assert same(ledger.reduce(add), serial_tally())
        assert run.step == 24
        cert = root / "grouped.campaign.json"
        batches = stored_batches(cert, read_certificate(cert).record)
        assert [b.index for b in batches] == list(range(24))  # each once
        workers = {b.worker for b in batches}
        assert f":{os.getpid()}" not in "".join(workers)  # the pool's, batch by batch
        # The policy's points: each batch is offered on its own, groups or not.
        assert sorted(int(m.name[5:13]) for m in (root / "grouped").glob("*.kaudit.json")) == [
            5,
            10,
            15,
            20,
            24,
        ]
        with (
            ka.Run("raises", root=root, seed=SEED, every=ka.Never()) as run,
            pytest.raises(ka.CampaignError) as e,
        ):
            run.map_batches(_raises_at_7, 24, executor=pool, per_call=5, samples=50)
    said = str(e.value)
    assert said.startswith("the campaign stopped: batch 7: ValueError: no data;"), said
    assert "\n" not in said
    # Its group's batches before it arrived and are kept; it and those after it are not.
    assert {5, 6} <= set(run.ledger.indices())
    assert not {7, 8, 9} & set(run.ledger.indices())
    with (
        ka.Run("r", root=root, seed=SEED) as run,
        pytest.raises(ka.UsageError, match="per_call must be an int >= 1"),
    ):
        run.map_batches(batch, 3, executor=None, per_call=0, samples=1)


def _raises_at_7(rng: np.random.Generator, samples: int) -> dict[str, np.float64]:
    if rng.bit_generator.seed_seq.spawn_key[0] == 7:  # type: ignore[attr-defined]
        raise ValueError("no data\nsecond line")
    return batch(rng, samples)


DRIVER = textwrap.dedent(
    """
    import concurrent.futures as cf, multiprocessing, os, sys, time
    from pathlib import Path
    import numpy as np
    import kronos_audit as ka

    def slow(rng, marks):
        Path(marks, str(os.getpid())).touch()  # the worker processes, by pid
        time.sleep(0.02)
        return np.float64(rng.random())

    if __name__ == "__main__":
        with ka.Run("orphans", root="checkpoints", seed=1) as run:
            context = multiprocessing.get_context(sys.argv[2])
            with cf.ProcessPoolExecutor(2, mp_context=context) as pool:
                run.map_batches(slow, 100_000, executor=pool, marks=sys.argv[1])
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has ended; only its reaping is left


@pytest.mark.parametrize("start", ["fork", "forkserver"])
def test_a_pool_worker_ends_when_its_driver_is_killed(
    project: Project, key: ka.SigningKey, start: str
) -> None:
    """Forked by the driver, or by its forkserver (Python 3.14's default on Linux)."""
    marks = project.root / "marks"
    marks.mkdir()
    (project.root / "driver.py").write_text(DRIVER)
    said = project.root / "driver.err"
    with said.open("wb") as err:
        driver = subprocess.Popen(
            [sys.executable, "driver.py", str(marks), start], cwd=project.root, stderr=err
        )
    workers: set[int] = set()
    started = time.monotonic()
    try:
        while len(workers) < 2 and driver.poll() is None:  # both workers have run batches
            assert time.monotonic() - started < HANG_GUARD, "the pool's workers never ran"
            time.sleep(0.05)
            workers = {int(p.name) for p in marks.iterdir()}
        assert driver.poll() is None, said.read_text()
        driver.send_signal(signal.SIGKILL)
        assert driver.wait(HANG_GUARD) == -signal.SIGKILL
        # Orphaned, they notice their parent changed and end, whatever they were doing.
        while any(_alive(pid) for pid in workers):
            assert time.monotonic() - started < HANG_GUARD, "the pool's workers outlive it"
            time.sleep(0.1)
    finally:
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
