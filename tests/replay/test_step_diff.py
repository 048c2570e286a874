"""`kaudit diff` of two sharded steps written on different rank counts: bitwise by the
digests their signed step manifests record, without their data; with a tolerance, by the
data of their shards. The runs are real (every rank's shard, rank 0's signature, DVC),
on ranks that are threads of this process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np

import kronos_audit as ka
from kronos_audit.checkpoint.layout import STEP_MANIFEST, shard_path, step_directory
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.parallel.layout import local_block
from kronos_audit.project.repository import Project
from tests.helpers import assert_bad_input, run_cli
from tests.threadranks import ThreadRanks, on_ranks, thread_run

LAYOUT: dict[str, ka.Block | ka.Replicated] = {
    "u": ka.Block(axis=0),
    "v": ka.Block(axis=1),
    "p": ka.Replicated(),
}
U = np.arange(11 * 3, dtype=np.float64).reshape(11, 3) / 7
V = np.arange(2 * 9, dtype=np.int32).reshape(2, 9)


def step_on(project: Project, run_id: str, ranks: int, u: np.ndarray[Any, Any] = U) -> Path:
    """Step 1 of run ``run_id`` on ``ranks`` ranks, holding the global arrays ``u``, V and
    a replicated one: its step directory."""

    def program(comm: ThreadRanks) -> None:
        with thread_run(project.root, run_id, comm) as run:
            state = {
                "u": local_block(u, LAYOUT["u"], ranks, comm.rank),
                "v": local_block(V, LAYOUT["v"], ranks, comm.rank),
                "p": np.linspace(0.0, 1.0, 4),
            }
            run.checkpoint(1, state, layout=LAYOUT)

    on_ranks(ranks, program)
    return step_directory(project.root / "checkpoints" / run_id, 1)


def diff_json(*args: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("diff", *args, "--json")
    assert result.exit_code in (0, 1), result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return result.exit_code, doc


def verdicts(doc: dict[str, Any]) -> dict[str, str]:
    return {d["path"]: d["verdict"] for d in doc["datasets"]}


def test_steps_on_three_and_two_ranks_compare_by_their_signed_digests_alone(
    project: Project, key: SigningKey
) -> None:
    on3, on2 = step_on(project, "on3", 3), step_on(project, "on2", 2)
    for step, count in ((on3, 3), (on2, 2)):  # the data is gone: the digests decide
        for r in range(count):
            shard_path(step, r, count).unlink()
    status, doc = diff_json(str(on3), str(on2 / STEP_MANIFEST))
    assert status == 0, doc
    assert verdicts(doc) == {"/u": "IDENTICAL", "/v": "IDENTICAL", "/p": "IDENTICAL"}

    changed = U.copy()
    changed[10, 2] += 1e-13
    other = step_on(project, "other", 2, changed)
    status, doc = diff_json(str(on3), str(other))
    assert status == 1
    assert verdicts(doc) == {"/u": "DIFFERENT", "/v": "IDENTICAL", "/p": "IDENTICAL"}
    shown = run_cli("diff", str(on3), str(other))
    assert shown.exit_code == 1
    assert "signed digests differ" in shown.output


def test_with_a_tolerance_the_shards_data_is_compared_across_rank_counts(
    project: Project, key: SigningKey
) -> None:
    on3 = step_on(project, "on3", 3)
    changed = U.copy()
    changed[10, 2] *= 1 + 1e-14
    other = step_on(project, "other", 2, changed)
    status, doc = diff_json(str(on3), str(other), "--rtol", "1e-12")
    assert status == 0, doc
    assert verdicts(doc)["/u"] == "WITHIN_TOLERANCE"
    assert verdicts(doc)["/v"] == "IDENTICAL"


def test_a_step_whose_manifest_does_not_verify_is_refused(
    project: Project, key: SigningKey
) -> None:
    on3, on2 = step_on(project, "on3", 3), step_on(project, "on2", 2)
    # A copy elsewhere in the repository: its manifest is not in its signed place.
    moved = project.root / "checkpoints" / "on2" / "step-00000007"
    shutil.copytree(on2, moved)
    assert_bad_input(run_cli("diff", str(on3), str(moved)), "does not verify")


def test_with_a_tolerance_a_shard_that_is_not_the_signed_one_is_refused(
    project: Project, key: SigningKey
) -> None:
    on3, on2 = step_on(project, "on3", 3), step_on(project, "on2", 2)
    with h5py.File(shard_path(on2, 1, 2), "r+") as f:
        f["u"][0, 0] += 1.0  # the data a tolerance would read, no longer what is signed
    assert_bad_input(run_cli("diff", str(on3), str(on2), "--rtol", "1e-9"), "does not verify")
    # Bitwise, the signed digests decide without reading it, and they still agree.
    assert run_cli("diff", str(on3), str(on2)).exit_code == 0
