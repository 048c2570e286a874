"""The Run API in-process: checkpoints, chain, restore, retention, batches, errors."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.errors import UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project


def simulate(
    root: Path, n: int, *, every: int = 10, run_id: str = "sim", **kw: Any
) -> dict[str, Any]:
    """A small stochastic loop; returns its final state (resuming whatever is on disk)."""
    with ka.Run(run_id, root=root, seed=42, every=ka.EverySteps(every), **kw) as run:
        state = run.restore()
        if state is None:
            state = {
                "fields": {"u": run.rng.random((32, 32))},
                "t": 0.0,
                "n": np.int64(0),
                "label": "heat",
            }
        for step in run.steps(n):
            noise = run.rng.standard_normal((32, 32)) + random.random()
            state = {
                "fields": {"u": 0.9 * state["fields"]["u"] + 0.01 * noise},
                "t": state["t"] + 0.1,
                "n": state["n"] + 1,
                "label": state["label"],
            }
            run.checkpoint(step, state)
    return state


def steps_on_disk(directory: Path) -> list[int]:
    return sorted(int(p.name[5:13]) for p in directory.glob("step-*.h5"))


def test_checkpoints_are_written_chained_and_verify(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    simulate(root, 35)
    assert steps_on_disk(root / "sim") == [10, 20, 30, 35]  # policy steps, then the last one
    results = ka.verify(root / "sim")
    assert [r.step for r in results] == [10, 20, 30, 35]
    assert all(r.ok for r in results), [r.failures for r in results]
    m = ka.read_manifest(root / "sim" / "step-00000035.h5.kaudit.json")
    assert m.parent == ka.read_manifest(root / "sim" / "step-00000030.h5.kaudit.json").digest
    assert list(m.predicate["seeds"]) == [42]
    assert m.predicate["rng"]["numpy"]["bit_generator"] == "PCG64"
    assert m.predicate["restart_count"] == 0
    assert m.predicate["command"][0] == "python"
    paths = {d.path for d in m.datasets or ()}
    assert {"/fields/u", "/t", "/n", "/label", "/rng/numpy", "/rng/python"} <= paths


def test_resumed_run_is_bitwise_identical(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    whole = simulate(root, 57, run_id="whole")
    simulate(root, 23, run_id="split")  # stops at 23: checkpoints 10, 20, 23
    resumed = simulate(root, 57, run_id="split")
    assert ka.state_digest(resumed) == ka.state_digest(whole)
    assert isinstance(resumed["label"], str)


def test_restore_returns_state_rng_and_step(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    simulate(root, 20)
    with ka.Run("sim", root=root, seed=42, every=ka.EverySteps(10)) as run:
        state = run.restore()
        assert state is not None
        assert run.step == 20
        assert run.restored_from == root / "sim" / "step-00000020.h5"
        assert list(run.steps(22)) == [21, 22]
        with h5py.File(root / "sim" / "step-00000020.h5") as f:
            np.testing.assert_array_equal(state["fields"]["u"], f["fields/u"][()])


def test_corrupt_newest_checkpoint_is_skipped(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    simulate(root, 30)
    newest = root / "sim" / "step-00000030.h5"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated
    with ka.Run("sim", root=root, seed=42) as run:
        with pytest.warns(ka.CheckpointSkipped, match="step-00000030"):
            state = run.restore()
        assert run.step == 20
        assert state is not None


def test_unsigned_and_half_written_checkpoints_are_skipped(
    project: Project, key: SigningKey
) -> None:
    root = project.root / "checkpoints"
    simulate(root, 30)
    (root / "sim" / "step-00000030.h5.kaudit.json").unlink()  # crashed before signing
    leftover = root / "sim" / ".kaudit-tmp-step-00000040.h5-deadbeef"
    leftover.write_bytes(b"\x89HDF\r\n\x1a\n half")  # crashed mid-write
    with ka.Run("sim", root=root, seed=42) as run:
        with pytest.warns(ka.CheckpointSkipped, match="no manifest"):
            state = run.restore()
        assert run.step == 20
        assert state is not None
    assert not leftover.exists()


def test_a_tampered_checkpoint_is_not_restored(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    simulate(root, 30)
    with h5py.File(root / "sim" / "step-00000030.h5", "r+") as f:
        f["fields/u"][0, 0] += 1.0
    with ka.Run("sim", root=root, seed=42) as run:
        with pytest.warns(ka.CheckpointSkipped, match="dataset /fields/u"):
            run.restore()
        assert run.step == 20


def test_retention_keeps_newest_and_every_kth(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    simulate(root, 75, every=5, keep=2, keep_every=20)
    assert steps_on_disk(root / "sim") == [20, 40, 60, 70, 75]
    results = ka.verify(root / "sim")  # pruned data: signatures and chain still verify
    assert all(r.ok for r in results)
    skipped = [r.step for r in results if any(c.skipped for c in r.checks)]
    assert skipped == [5, 10, 15, 25, 30, 35, 45, 50, 55, 65]


def test_synchronous_mode_writes_before_returning(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    with ka.Run("sync", root=root, seed=1, every=ka.EverySteps(1), asynchronous=False) as run:
        for step in run.steps(3):
            run.checkpoint(step, {"x": np.full(10, step)})
            assert (root / "sync" / f"step-{step:08d}.h5.kaudit.json").exists()


def test_reserved_and_unstorable_state_is_refused(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    with ka.Run("bad", root=root, seed=1, every=ka.EverySteps(1)) as run:
        with pytest.raises(UsageError, match="reserved"):
            run.checkpoint(1, {"rng": np.zeros(1)})
        with pytest.raises(UsageError, match="object"):
            run.checkpoint(1, {"x": object()})


def test_run_outside_with_and_bad_arguments(project: Project, key: SigningKey) -> None:
    run = ka.Run("x", root=project.root / "checkpoints")
    with pytest.raises(UsageError, match="with"):
        run.checkpoint(1, {})
    with pytest.raises(UsageError, match="keep"):
        ka.Run("x", keep=0)
    with pytest.raises(UsageError, match="run id"):
        ka.Run("a/b")


def test_batches_skip_recorded_and_tally_is_order_independent(
    project: Project, key: SigningKey
) -> None:
    root = project.root / "checkpoints"

    def tally(run_id: str, order_seed: int | None, stop_after: int | None = None) -> Any:
        with ka.Run(run_id, root=root, seed=9, every=ka.EverySteps(1)) as run:
            run.restore()
            todo = list(run.batches(12))
            if order_seed is not None:
                random.Random(order_seed).shuffle(todo)
            for n, (i, rng) in enumerate(todo):
                if stop_after is not None and n == stop_after:
                    return None
                run.record(i, {"sum": rng.standard_normal(1000).sum(), "hist": np.arange(3) * i})
                run.checkpoint(i, {})
            return run.ledger.reduce(lambda a, b: {k: a[k] + b[k] for k in a})

    plain = tally("plain", None)
    shuffled = tally("shuffled", 3)
    assert tally("interrupted", 5, stop_after=7) is None
    with ka.Run("interrupted", root=root, seed=9, every=ka.EverySteps(1)) as run:
        run.restore()
        assert len(run.ledger) == 7
        assert len(list(run.batches(12))) == 5  # only the missing ones
    resumed = tally("interrupted", 11)
    assert ka.state_digest(shuffled) == ka.state_digest(plain)
    assert ka.state_digest(resumed) == ka.state_digest(plain)
    m = ka.read_manifest(root / "plain" / "step-00000012.h5.kaudit.json")
    assert m.predicate["batches"]["total"] == m.predicate["batches"]["done"] == 12
    # every batch is recorded once along the chain, by the checkpoint that first held it
    chain = [ka.read_manifest(p) for p in sorted((root / "plain").glob("*.kaudit.json"))]
    ran = [i for c in chain for r in c.record.batches.ran for i in r.indices()]  # type: ignore[union-attr]
    assert sorted(ran) == list(range(12))


def test_batch_rng_depends_only_on_seed_and_index() -> None:
    a = ka.runtime.batch_rng(5, 3).random(4)
    assert np.array_equal(
        a, np.random.default_rng(np.random.SeedSequence(5, spawn_key=(3,))).random(4)
    )
    assert not np.array_equal(a, ka.runtime.batch_rng(5, 4).random(4))


def test_replay_instruction_resumes_stops_and_writes_there(
    project: Project, key: SigningKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kronos_audit.checkpoint.hashing import digest_file

    root = project.root / "checkpoints"
    simulate(root, 30)
    recorded = ka.read_manifest(root / "sim" / "step-00000020.h5.kaudit.json")
    for resume, out in (
        (root / "sim" / "step-00000010.h5", tmp_path / "from10"),
        (None, tmp_path / "from-start"),
    ):
        monkeypatch.setenv("KAUDIT_STOP_AT", "20")
        monkeypatch.setenv("KAUDIT_OUT", str(out))
        if resume is None:
            monkeypatch.delenv("KAUDIT_RESUME_FROM", raising=False)
        else:
            monkeypatch.setenv("KAUDIT_RESUME_FROM", str(resume))
        with pytest.raises(SystemExit) as stopped:
            simulate(root, 30)  # asks for 30 steps; the replay stops it at 20
        assert stopped.value.code == 0
        # one file, unsigned, and the environment lock the program ran with
        assert sorted(p.name for p in out.iterdir()) == [
            ".kaudit-environment.json",
            "step-00000020.h5",
        ]
        produced = digest_file(out / "step-00000020.h5")
        assert produced.datasets == recorded.datasets  # bitwise the recorded step 20
    assert steps_on_disk(root / "sim") == [10, 20, 30]  # the run's own directory untouched


def test_a_half_given_replay_instruction_is_refused(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAUDIT_STOP_AT", "20")
    monkeypatch.delenv("KAUDIT_OUT", raising=False)
    with pytest.raises(UsageError, match="KAUDIT_OUT"):
        ka.Run("x", root=project.root / "checkpoints")


# -- the policy alone decides: the final step and preemption are in its context -------------


def loop(root: Path, n: int, policy: ka.SavePolicy | None, run_id: str = "p") -> list[bool]:
    """A small deterministic loop under ``policy``; returns what checkpoint() returned."""
    taken = []
    with ka.Run(run_id, root=root, seed=42, every=policy) as run:
        state = run.restore() or {"u": np.zeros(8)}
        for step in run.steps(n):
            state = {"u": state["u"] + run.rng.random(8)}
            taken.append(run.checkpoint(step, state))
    return taken


def test_never_writes_nothing_in_a_real_run(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    assert loop(root, 12, ka.Never()) == [False] * 12
    # Not the final step either: no data, no manifest; only the run's writer lock is there.
    assert sorted(p.name for p in (root / "p").iterdir()) == [
        ".gitignore",
        ".kaudit-writer.holder",
        ".kaudit-writer.lock",
    ]


def test_at_final_step_writes_the_last_step_only(project: Project, key: SigningKey) -> None:
    root = project.root / "checkpoints"
    assert loop(root, 12, ka.AtFinalStep()) == [False] * 11 + [True]
    assert steps_on_disk(root / "p") == [12]


def test_an_interval_policy_saves_at_the_final_step_unless_told_not_to(
    project: Project, key: SigningKey
) -> None:
    root = project.root / "checkpoints"
    loop(root, 12, ka.EverySteps(5), run_id="default")
    assert steps_on_disk(root / "default") == [5, 10, 12]
    loop(root, 12, ka.EverySteps(5, final=False), run_id="bare")
    assert steps_on_disk(root / "bare") == [5, 10]
    loop(root, 12, ka.EverySteps(5, final=False) | ka.AtFinalStep(), run_id="composed")
    assert steps_on_disk(root / "composed") == [5, 10, 12]
    loop(root, 12, None, run_id="unset")  # EverySeconds(600): only the final step, so soon
    assert steps_on_disk(root / "unset") == [12]


def test_a_policy_of_ones_own_is_asked_as_it_is(project: Project, key: SigningKey) -> None:
    seen: list[tuple[int, bool, bool]] = []

    class Record:
        def should_save(self, ctx: ka.SaveContext) -> bool:
            seen.append((ctx.step, ctx.final, ctx.preempted))
            return ctx.step == 2

    root = project.root / "checkpoints"
    assert loop(root, 4, Record()) == [False, True, False, False]
    assert seen == [(1, False, False), (2, False, False), (3, False, False), (4, True, False)]
    assert steps_on_disk(root / "p") == [2]  # nothing added at the final step


def test_a_time_policy_counts_from_the_loop_not_the_set_up_before_it(
    project: Project, key: SigningKey
) -> None:
    seen: list[float] = []

    class Record:
        def should_save(self, ctx: ka.SaveContext) -> bool:
            seen.append(ctx.last_time)
            return False

    with ka.Run("setup", root=project.root / "checkpoints", seed=1, every=Record()) as run:
        run.restore()
        time.sleep(0.01)  # set-up: loading data, compiling ...
        loop_starts = time.monotonic()
        for step in run.steps(2):
            run.checkpoint(step, {"u": np.zeros(3)})
    assert len(seen) == 2
    assert all(t >= loop_starts for t in seen)  # not the time the run was entered


def test_a_batched_runs_final_batch_is_in_the_context(project: Project, key: SigningKey) -> None:
    finals: list[bool] = []

    class Final:
        def should_save(self, ctx: ka.SaveContext) -> bool:
            finals.append(ctx.final)
            return ctx.final

    root = project.root / "checkpoints"
    with ka.Run("mc", root=root, seed=9, every=Final()) as run:
        run.restore()
        for i, rng in run.batches(4):
            run.record(i, {"sum": rng.standard_normal(10).sum()})
            run.checkpoint(i, {})
    assert finals == [False, False, False, True]
    assert steps_on_disk(root / "mc") == [4]


def test_a_replay_writes_its_step_whatever_the_programs_policy(
    project: Project, key: SigningKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kronos_audit.checkpoint.hashing import digest_file

    root = project.root / "checkpoints"
    loop(root, 12, ka.EverySteps(4), run_id="rec")
    recorded = ka.read_manifest(root / "rec" / "step-00000008.h5.kaudit.json")
    out = tmp_path / "out"
    monkeypatch.setenv("KAUDIT_STOP_AT", "8")
    monkeypatch.setenv("KAUDIT_OUT", str(out))
    monkeypatch.setenv("KAUDIT_RESUME_FROM", str(root / "rec" / "step-00000004.h5"))
    for policy in (ka.Never(), ka.OnPreemption(), ka.EverySteps(1)):
        for leftover in out.glob("*"):
            leftover.unlink()
        with pytest.raises(SystemExit) as stopped:
            loop(root, 12, policy, run_id="rec")
        assert stopped.value.code == 0
        # step N, and only it (beside the environment lock the program ran with)
        assert sorted(p.name for p in out.iterdir()) == [
            ".kaudit-environment.json",
            "step-00000008.h5",
        ]
        assert digest_file(out / "step-00000008.h5").datasets == recorded.datasets
    assert steps_on_disk(root / "rec") == [4, 8, 12]


def test_the_state_is_flattened_once_per_checkpoint(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kronos_audit.checkpoint.codec.tree import encode

    calls: list[int] = []

    def counting(state: Any) -> Any:
        calls.append(1)
        return encode(state)

    monkeypatch.setattr("kronos_audit.checkpoint.codec.tree.encode", counting)
    root = project.root / "checkpoints"
    assert loop(root, 3, ka.EverySteps(1)) == [True, True, True]
    assert len(calls) == 3  # the first checkpoint too: one flatten warms and stages it
    calls.clear()
    assert loop(root, 6, ka.EverySteps(2), run_id="q") == [False, True, False, True, False, True]
    assert len(calls) == 4  # the first offer (to warm the buffers), then once per save


# -- clear errors at the API's edge -----------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (np.zeros(3), "state must be a mapping of names to arrays, got ndarray"),
        (None, "state must be a mapping of names to arrays, got None"),
        ([("x", 1)], "state must be a mapping of names to arrays, got list"),
        ({"x": lambda: None}, "state /x: a function cannot be stored; "),
        ({"x": {"y": [1, {2}]}}, "state /x/y/1: a set cannot be stored; "),
        ({"x": object()}, "state /x: an object cannot be stored; "),
    ],
)
def test_a_state_that_cannot_be_stored_is_one_clear_line(
    project: Project, key: SigningKey, state: Any, message: str
) -> None:
    root = project.root / "checkpoints"
    with ka.Run("bad", root=root, seed=1, every=ka.EverySteps(1)) as run:
        with pytest.raises(UsageError) as info:
            run.checkpoint(1, state)
        run.checkpoint(2, {"x": np.zeros(3)})  # the run goes on
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)
    assert "NoneType" not in str(info.value)
    assert steps_on_disk(root / "bad") == [2]


def test_a_batch_result_of_none_is_named_properly() -> None:
    with pytest.raises(UsageError, match=r"a dict of them, not None$"):
        ka.Ledger().record(0, None)
    with pytest.raises(UsageError, match=r"a dict of them, not a list$"):
        ka.Ledger().record(0, [1.0])


def test_every_must_be_a_policy(project: Project, key: SigningKey) -> None:
    with pytest.raises(UsageError, match=r"every must be a save policy .* got int$"):
        ka.Run("x", root=project.root / "checkpoints", every=10)  # type: ignore[arg-type]
