"""The memory and partner levels on three thread ranks, three simulated nodes: every step
kept in each node's memory directory, signed, with a partner's copy; a restart restores
the newest step from the nearest level that holds it verified.

A lost rank is its memory directory dropped; a lost node, its node's directory (own
copies and the partner copies it kept); a hostile partner copy, its bytes replaced. The
runs are real (shards, rank 0's signature, DVC tracking of the durable steps)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.checkpoint.layout import STEP_MANIFEST, shard_name, step_directory
from kronos_audit.errors import CheckpointSkipped, UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.parallel.layout import Layout
from kronos_audit.project.repository import Project
from kronos_audit.report import build_report, render_html
from kronos_audit.signing.predicate import utc_now
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.storage.remote import configure_remote
from tests.helpers import git, run_cli
from tests.threadranks import ThreadRanks, on_ranks, thread_run

RUN = "heat"
SIZE = 3
LAYOUT: dict[str, Layout] = {"u": ka.Block(axis=0), "c": ka.Replicated()}


def advance(u: np.ndarray[Any, Any], rng: np.random.Generator) -> np.ndarray[Any, Any]:
    return np.asarray(u * 0.5 + rng.random(u.shape))


class Killed(Exception):
    """The test's kill of every rank, after a step (the process gone: nothing more)."""


def program(
    root: Path, shm: Path, steps: int, kill_after: int | None = None, push: bool = False
) -> Any:
    def main(comm: ThreadRanks) -> tuple[int | None, str | None, np.ndarray[Any, Any]]:
        levels = [
            ka.MemoryLevel(str(shm / "node{node}"), every=1, keep=2),
            ka.PartnerLevel(every=1, keep=1, nodes=SIZE),
        ]
        with ka.Run(
            RUN,
            root=root / "checkpoints",
            seed=5,
            every=ka.EverySteps(4),
            comm=comm,
            asynchronous=False,
            levels=levels,
            push=push,
        ) as run:
            state = run.restore()
            u = np.full(4, float(comm.rank)) if state is None else state["u"]
            # The same on every rank (replicated: rank 0's shard alone holds it).
            c = np.zeros(2) if state is None else state["c"]
            start = run.step
            for step in run.steps(steps):
                u, c = advance(u, run.rng), c + step
                run.checkpoint(step, {"u": u, "c": c}, layout=LAYOUT)
                if step == kill_after:
                    raise Killed
            assert run.levels is not None
            np.testing.assert_array_equal(c, np.full(2, steps * (steps + 1) / 2))
            return start, run.levels.recovered, u

    return main


def run(project: Project, shm: Path, steps: int) -> list[Any]:
    return on_ranks(SIZE, program(project.root, shm, steps))


def killed_after(project: Project, shm: Path, step: int, push: bool = False) -> None:
    """A run of 7 steps killed after step ``step`` (the durable level holds step 4)."""
    with pytest.raises(Killed):
        on_ranks(SIZE, program(project.root, shm, 7, kill_after=step, push=push))


def finals(results: list[Any]) -> list[np.ndarray[Any, Any]]:
    return [u for _, _, u in results]


@pytest.fixture
def whole(project: Project, key: SigningKey, shm: Path, tmp_path: Path) -> list[Any]:
    """An uninterrupted run of 7 steps, for the final states."""
    other = tmp_path / "whole-shm"
    shutil.copytree(shm, other)
    results = on_ranks(SIZE, program(project.root, other, 7))
    shutil.rmtree(project.root / "checkpoints")
    return finals(results)


def test_each_step_is_on_the_memory_level_signed_with_a_partner_copy(
    project: Project, key: SigningKey, shm: Path
) -> None:
    run(project, shm, 5)
    for node in range(SIZE):
        own = shm / f"node{node}" / RUN
        # keep=2: steps 4 and 5; this node's rank only (a node a rank)
        assert sorted(p.name for p in own.iterdir()) == ["step-00000004", "step-00000005"]
        held = shm / f"node{node}" / "partners" / RUN
        assert sorted(p.name for p in held.iterdir()) == ["step-00000005"]
        source = (node - 1) % SIZE  # the rank on the node before
        assert (step_directory(held, 5) / shard_name(source, SIZE)).is_file()
        manifest = read_manifest(step_directory(own, 5) / STEP_MANIFEST)
        assert (manifest.run, manifest.step) == (RUN, 5)
        levels = manifest.record.attributes["kaudit.levels"]
        assert list(levels["levels"]) == ["memory", "partner", "durable"]  # 5: the final
        assert levels["durable"]["step"] == 4  # the durable step it builds on
    # The durable level has its own steps only (every 4, and the final one).
    durable = project.root / "checkpoints" / RUN
    assert sorted(p.name for p in durable.glob("step-*")) == ["step-00000004", "step-00000005"]
    # `kaudit status` lists the levels' steps, while their directories exist.
    done = run_cli("status", str(durable), "--local-only", "--level-dir", f"{shm}/node{{node}}")
    assert done.exit_code == 0, done.output
    lines = [line for line in done.output.splitlines() if "run heat step" in line]
    assert lines == [
        "memory run heat step 4: 3 shards",
        "memory run heat step 5: 3 shards",
        "partner run heat step 5: 3 shards",
    ]
    done = run_cli("log", str(durable), "--level-dir", f"{shm}/node{{node}}")
    assert done.exit_code == 0, done.output
    assert "levels      memory steps 4, 5; partner step 5" in done.output
    shutil.rmtree(shm)
    done = run_cli("status", str(durable), "--local-only", "--level-dir", f"{shm}/node{{node}}")
    assert "no step on the levels in the directories given" in done.output


def test_a_restart_resumes_from_the_memory_level(
    project: Project, key: SigningKey, shm: Path, whole: list[Any], caplog: Any
) -> None:
    killed_after(project, shm, 6)
    with caplog.at_level(logging.INFO, logger="kronos_audit.runtime"):
        results = run(project, shm, 7)
    assert [(s, lvl) for s, lvl, _ in results] == [(6, "memory")] * SIZE
    assert "restored from the memory level" in caplog.text
    for got, want in zip(finals(results), whole, strict=True):
        np.testing.assert_array_equal(got, want)
    # The durable chain, verified alone (the RAM directories gone), records the recovery.
    shutil.rmtree(shm)
    durable = project.root / "checkpoints" / RUN
    step7 = read_manifest(step_directory(durable, 7) / STEP_MANIFEST)
    assert dict(step7.record.attributes["kaudit.recovered"]) == {"step": 6, "level": "memory"}
    runs = build_report([durable]).runs
    (report,) = runs
    assert report.verification.failed == 0
    (gap,) = report.chain.gaps
    assert (gap.after_step, gap.before_step, gap.level, gap.resumed_step) == (4, 7, "memory", 6)
    assert "resumed from step 6 on the memory level" in render_html(build_report([durable]))


def test_a_lost_node_resumes_through_its_partner_without_the_remote(
    project: Project, key: SigningKey, shm: Path, whole: list[Any], tmp_path: Path
) -> None:
    remote = tmp_path / "remote"
    configure_remote(project, str(remote))
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "remote")
    killed_after(project, shm, 6, push=True)
    assert any(remote.rglob("*")), "step 4 was pushed"
    shutil.rmtree(shm / "node1")
    (shm / "node1").mkdir()  # the job script makes it again
    shutil.rmtree(remote)
    remote.write_text("not a directory: the remote is unreachable")
    results = on_ranks(SIZE, program(project.root, shm, 7, push=True))
    assert [(s, lvl) for s, lvl, _ in results] == [(6, "partner")] * SIZE
    for got, want in zip(finals(results), whole, strict=True):
        np.testing.assert_array_equal(got, want)


def test_ranks_placed_anew_on_the_nodes_left_find_their_copies(
    project: Project, key: SigningKey, shm: Path, whole: list[Any]
) -> None:
    killed_after(project, shm, 6)
    # Node 1 is lost, and the restarted ranks are placed anew: rank 1 on a new node, rank 2
    # where rank 1 was... its node's directory holds none of its own copies now.
    shutil.rmtree(shm / "node1")
    (shm / "node2").rename(shm / "node1")
    (shm / "node2").mkdir()
    results = run(project, shm, 7)
    assert [(s, lvl) for s, lvl, _ in results] == [(6, "partner")] * SIZE
    for got, want in zip(finals(results), whole, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_changed_memory_copy_is_refused_and_the_partner_copy_used(
    project: Project, key: SigningKey, shm: Path, whole: list[Any]
) -> None:
    killed_after(project, shm, 6)
    own = step_directory(shm / "node1" / RUN, 6) / shard_name(1, SIZE)
    older = step_directory(shm / "node1" / RUN, 5) / shard_name(1, SIZE)
    own.write_bytes(older.read_bytes())  # signed bytes, of another step
    with pytest.warns(CheckpointSkipped, match="the memory copy of rank 1 refused"):
        results = run(project, shm, 7)
    assert [(s, lvl) for s, lvl, _ in results] == [(6, "partner")] * SIZE
    for got, want in zip(finals(results), whole, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_hostile_partner_copy_is_refused_and_the_durable_level_used(
    project: Project, key: SigningKey, shm: Path, whole: list[Any]
) -> None:
    killed_after(project, shm, 6)
    shutil.rmtree(shm / "node1")
    (shm / "node1").mkdir()
    copy = step_directory(shm / "node2" / "partners" / RUN, 6) / shard_name(1, SIZE)
    data = bytearray(copy.read_bytes())
    data[-1] ^= 1
    copy.write_bytes(bytes(data))
    restarted = utc_now()
    with pytest.warns(CheckpointSkipped) as caught:
        results = run(project, shm, 7)
    said = [str(w.message) for w in caught]
    assert any("partner copy of rank 1 refused" in m and str(copy.parent) in m for m in said)
    assert any("restoring from the durable level" in m for m in said)
    assert [(s, lvl) for s, lvl, _ in results] == [(4, None)] * SIZE
    for got, want in zip(finals(results), whole, strict=True):
        np.testing.assert_array_equal(got, want)
    # The lost attempt's steps 5 and 6 went from the levels: the new 6 and 7 are there.
    own = shm / "node0" / RUN
    assert sorted(p.name for p in own.iterdir()) == ["step-00000006", "step-00000007"]
    manifest = read_manifest(step_directory(own, 6) / STEP_MANIFEST)
    assert manifest.record.created > restarted


def test_a_partner_level_alone_or_on_one_node_is_refused(
    project: Project, key: SigningKey, shm: Path
) -> None:
    with pytest.raises(UsageError, match="PartnerLevel needs a MemoryLevel"):
        ka.Run(RUN, root=project.root / "checkpoints", levels=[ka.PartnerLevel()])

    def one_node(comm: ThreadRanks) -> None:
        levels = [ka.MemoryLevel(str(shm / "node0")), ka.PartnerLevel()]
        with thread_run(project.root, RUN, comm, levels=levels):
            pass

    with pytest.raises(UsageError, match="all 3 ranks are on one node"):
        on_ranks(SIZE, one_node)

    def missing(comm: ThreadRanks) -> None:
        levels = [ka.MemoryLevel(str(shm / "gone{node}"))]
        with thread_run(project.root, RUN, comm, levels=levels):
            pass

    with pytest.raises(UsageError, match="gone0' does not exist"):
        on_ranks(SIZE, missing)


def test_one_process_resumes_from_its_memory_level(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    level = ka.MemoryLevel(tmp_path, every=1, keep=1)
    root = project.root / "checkpoints"

    def steps(n: int, kill_after: int | None = None) -> tuple[int | None, float]:
        with ka.Run("one", root=root, seed=2, every=ka.EverySteps(3), levels=[level]) as run:
            state = run.restore()
            start, x = run.step, (0.0 if state is None else float(state["x"]))
            # The ledger: in chunks beside the durable steps, whole in the level's shard.
            assert len(run.ledger) == (start or 0)
            for step in run.steps(n):
                x = x * 0.5 + float(run.rng.random())
                run.record(step, x)
                run.checkpoint(step, {"x": x})
                if step == kill_after:
                    run.wait()
                    raise Killed
        return start, x

    with pytest.raises(Killed):
        steps(6, kill_after=5)
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["step-00000005"]
    resumed, x = steps(6)
    assert resumed == 5
    shutil.rmtree(root)
    shutil.rmtree(tmp_path / "one")
    assert steps(6) == (None, x)


def test_a_node_index_the_job_gives_wrong_is_one_line_on_every_rank(
    project: Project, key: SigningKey, shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_NODEID", "node-1")

    def program(comm: ThreadRanks) -> None:
        levels = [ka.MemoryLevel(str(shm / "node{node}")), ka.PartnerLevel()]
        with thread_run(project.root, RUN, comm, levels=levels):
            pass

    with pytest.raises(UsageError, match=r"^rank 0: SLURM_NODEID='node-1': not a node index$"):
        on_ranks(SIZE, program)
