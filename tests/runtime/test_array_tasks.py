"""A campaign split over the tasks of a job array: each task its own run
(``NAME.task-K``), doing the batches ``i % tasks == K``, its share signed in every
manifest; `kaudit campaign` reads the tasks back (done, missing, the `sbatch` line that
resubmits the incomplete ones) and certifies the whole; the merged ledger's tally is
bitwise a serial run's. The tasks run here in this process, one after another, as Slurm
would run them with their environment; tests/slurm/test_array.py runs them under Slurm."""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
from typing import Any

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit.project.repository import Project
from kronos_audit.report import build_report, report_json
from kronos_audit.runtime.campaigns.certify import write_parts
from kronos_audit.statement.campaign import (
    PREDICATE_TYPE_V3,
    encode_statement,
    read_certificate,
    result_digest,
    tally,
)
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.statement.manifest import read_manifest
from kronos_audit.verification.parts import stored_parts
from kronos_audit.verification.records import stored_batches
from tests.helpers import run_cli

SEED = 5
N = 11  # not a multiple of the array's size: the shares are of 3 and 2 batches
TASKS = 4


def batch(rng: np.random.Generator, samples: int, fail_at: int = -1) -> dict[str, Any]:
    i = rng.bit_generator.seed_seq.spawn_key[0]  # type: ignore[attr-defined]
    if i == fail_at:
        raise RuntimeError(f"batch {i}: the node went away")
    x = rng.random(samples)
    return {"hits": np.int64((x < 0.25).sum()), "sum": np.float64(x.sum())}


def add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {k: a[k] + b[k] for k in a}


def task(project: Project, k: int, tasks: int = TASKS, **kwargs: Any) -> ka.Run:
    env = {"SLURM_ARRAY_TASK_ID": str(k), "SLURM_ARRAY_TASK_COUNT": str(tasks)}
    with ka.Run(
        "mc",
        root=project.root / "checkpoints",
        seed=SEED,
        every=ka.EverySteps(2),
        task=ka.ArrayTask.from_slurm(env),
    ) as run:
        run.restore()
        run.map_batches(batch, N, samples=32, **kwargs)
    return run


def campaign_json(project: Project, *args: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("campaign", "mc", "--json", *args, cwd=project.root)
    return result.exit_code, json.loads(result.output)


def test_array_task_from_slurm_reads_the_task_and_the_array_size() -> None:
    assert ka.ArrayTask.from_slurm({}) is None  # not an array job: the whole campaign
    got = ka.ArrayTask.from_slurm({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "8"})
    assert got is not None
    assert (got.task, got.tasks) == (3, 8)
    # Resubmitted alone (sbatch --array=3): Slurm counts 1 task, the export says 8.
    alone = {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "1", "KAUDIT_ARRAY_TASKS": "8"}
    again = ka.ArrayTask.from_slurm(alone)
    assert again is not None
    assert (again.task, again.tasks) == (3, 8)
    with pytest.raises(ka.UsageError, match="KAUDIT_ARRAY_TASKS"):
        ka.ArrayTask.from_slurm({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "1"})
    with pytest.raises(ka.UsageError, match="not a task number"):
        ka.ArrayTask.from_slurm({"SLURM_ARRAY_TASK_ID": "3;rm", "SLURM_ARRAY_TASK_COUNT": "8"})
    with pytest.raises(ka.UsageError, match="numbered from 0"):
        ka.ArrayTask(-1, 4)


def test_an_array_task_needs_a_seed_and_records_only_its_share(
    project: Project, key: ka.SigningKey
) -> None:
    with pytest.raises(ka.UsageError, match="needs seed="):
        ka.Run("mc", root=project.root / "checkpoints", task=ka.ArrayTask(0, 2))
    with ka.Run("mc", root=project.root / "checkpoints", seed=1, task=ka.ArrayTask(1, 2)) as run:
        assert run.run_id == "mc.task-1"
        assert [i for i, _ in run.batches(5)] == [1, 3]
        with pytest.raises(ka.UsageError, match="not in array task 1's share"):
            run.record(2, 1.0)


def test_kaudit_campaign_names_what_is_missing_and_certifies_a_complete_array(
    project: Project, key: ka.SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "100")  # each task a Slurm job, as sbatch makes them
    for k in (0, 1):
        task(project, k)
    with pytest.raises(ka.CampaignError, match="batch 10"):
        task(project, 2, fail_at=10)  # task 2 does 2 and 6, then its node goes away
    # Task 2's manifests sign its share; task 3 never started.
    newest = project.root / "checkpoints" / "mc.task-2" / "step-00000002.h5.kaudit.json"
    batches = read_manifest(newest).record.batches
    assert batches is not None
    assert batches.share is not None
    assert (batches.share.task, batches.share.tasks, batches.share.of) == (2, TASKS, N)
    assert (batches.total, batches.done) == (3, 2)

    code, doc = campaign_json(project, "--script", "mc.sbatch")
    assert code == 1
    assert (doc["tasks"], doc["n"], doc["done"]) == (TASKS, N, 8)
    states = {p["task"]: (p["state"], p["missing"]) for p in doc["parts"]}
    assert states == {
        0: ("done", []),
        1: ("done", []),
        2: ("partial", [10]),
        3: ("not started", [3, 7]),
    }
    assert doc["resubmit"] == "sbatch --array=2-3 --export=ALL,KAUDIT_ARRAY_TASKS=4 mc.sbatch"
    # An array larger than the table: only the tasks not done are rows, the rest counted.
    monkeypatch.setattr("kronos_audit.cli.commands.campaign.ROWS", 1)  # for the rest too
    listed = run_cli("campaign", "mc", cwd=project.root)
    assert listed.exit_code == 1, listed.output
    rows = [line.split()[0] for line in listed.output.splitlines() if line[:1] == " "]
    assert [r for r in rows if r.isdigit()] == ["2"]
    assert "3 task(s) not in the table: 2 done, 1 not done" in listed.output
    with pytest.raises(ka.CampaignError, match="3 of 11 batches missing"):
        ka.campaign_ledger("mc", project.root / "checkpoints")
    shown = run_cli("campaign", "mc", "--certify", cwd=project.root)
    assert shown.exit_code == 1, shown.output
    assert "not certified" in shown.output
    assert not (project.root / "checkpoints" / "mc.campaign.json").exists()

    # The line's tasks run again, a new Slurm job: task 2 resumes and does only batch 10.
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    again = task(project, 2)
    assert again.restored_from is not None
    task(project, 3)
    certified = run_cli("campaign", "mc", "--certify", cwd=project.root)
    assert certified.exit_code == 0, certified.output
    assert "11 of 11 batches in 4 task(s)" in certified.output
    cert = project.root / "checkpoints" / "mc.campaign.json"
    verified = run_cli("verify", str(cert), cwd=project.root)
    assert verified.exit_code == 0, verified.output

    serial = [batch(ka.runtime.batch_rng(SEED, i), 32) for i in range(N)]
    merged = ka.campaign_ledger("mc", project.root / "checkpoints").reduce(add)
    expected = functools.reduce(add, serial)  # in index order, in one process
    assert {k: v.tobytes() for k, v in merged.items()} == {
        k: np.asarray(v).tobytes() for k, v in expected.items()
    }
    read = read_certificate(cert)
    record = read.record
    # The third version: the parts are lines beside the batches' records, and the subjects
    # are the two index files that name them.
    assert read.statement["predicateType"] == PREDICATE_TYPE_V3
    assert record.records is not None
    assert record.part_records is not None
    assert [s["name"] for s in read.statement["subject"]] == [
        f"checkpoints/mc.records/{sha}" for sha in (record.records.index, record.part_records.index)
    ]
    record = dataclasses.replace(
        record, batches=stored_batches(cert, record), parts=stored_parts(cert, record)
    )
    assert [(p.run, p.task, p.tasks) for p in record.parts] == [
        (f"mc.task-{k}", k, TASKS) for k in range(TASKS)
    ]
    assert [b.part for b in record.batches] == [i % TASKS for i in range(N)]
    # Task 2's resubmission is its second attempt; what its first had recorded was kept.
    assert [b.attempt for b in record.batches] == [2 if i == 10 else 1 for i in range(N)]
    (shown,) = [
        r
        for r in report_json(build_report([project.root / "checkpoints"]))["runs"]
        if "campaign" in r
    ]
    assert shown["run"] == "mc.task-0"
    assert shown["campaign"]["rerun"] == 1
    assert [w["batches"] for w in shown["campaign"]["workers_lost"]] == [2]
    assert record.tally == result_digest(tally(serial))


def test_a_certificate_that_gives_a_part_another_task_than_it_signs_fails(
    project: Project, key: ka.SigningKey
) -> None:
    for k in range(TASKS):
        task(project, k)
    assert run_cli("campaign", "mc", "--certify", cwd=project.root).exit_code == 0
    cert = project.root / "checkpoints" / "mc.campaign.json"
    record = read_certificate(cert).record
    parts = list(stored_parts(cert, record))
    parts[1] = dataclasses.replace(parts[1], task=3)
    lied = dataclasses.replace(record, part_records=write_parts(cert, "mc", parts, project.root))
    cert.write_bytes(encode_envelope(sign_envelope(encode_statement(lied), key)))
    result = run_cli("verify", "--json", str(cert), cwd=project.root)
    assert result.exit_code == 1, result.output
    (r,) = json.loads(result.output)["results"]
    failed = [f"{c['check']}: {c['detail']}" for c in r["checks"] if not c["ok"]]
    assert failed == ["manifest: part 1 (mc.task-1): not task 3 of campaign 'mc'"]


def test_files_named_as_newer_manifests_decide_nothing_and_are_named_ignored(
    project: Project, key: ka.SigningKey
) -> None:
    for k in range(TASKS):
        task(project, k)
    run_dir = project.root / "checkpoints" / "mc.task-1"
    (newest,) = sorted(run_dir.glob("step-*.h5.kaudit.json"))[-1:]
    # An empty file, and task 1's own signed manifest copied to a later step's name: neither
    # is a checkpoint of step 98 or 99, and neither may hide the batches task 1 signed.
    (run_dir / "step-00000099.h5.kaudit.json").write_bytes(b"")
    shutil.copy(newest, run_dir / "step-00000098.h5.kaudit.json")

    code, doc = campaign_json(project)
    assert code == 0, doc
    part = doc["parts"][1]
    assert (part["state"], part["missing"]) == ("done", [])
    assert part["manifest"] == project.relative(newest)
    assert [why.split(": ")[0] for why in part["ignored"]] == [
        "checkpoints/mc.task-1/step-00000099.h5.kaudit.json",
        "checkpoints/mc.task-1/step-00000098.h5.kaudit.json",
    ]
    assert "place: the file is named for step 98" in part["ignored"][1]
    assert all(not p["ignored"] for k, p in enumerate(doc["parts"]) if k != 1)

    certified = run_cli("campaign", "mc", "--certify", cwd=project.root)
    assert certified.exit_code == 0, certified.output
    assert "task 1: ignored checkpoints/mc.task-1/step-00000099.h5.kaudit.json" in (
        certified.output
    )
    cert = project.root / "checkpoints" / "mc.campaign.json"
    assert run_cli("verify", str(cert), cwd=project.root).exit_code == 0
    assert ka.campaign_ledger("mc", project.root / "checkpoints").indices() == list(range(N))


def test_a_task_resumed_as_a_task_of_another_array_size_is_refused(
    project: Project, key: ka.SigningKey
) -> None:
    task(project, 1)
    with pytest.raises(ka.UsageError, match="another array size"):
        task(project, 1, tasks=3)  # its ledger holds 5 and 9: not task 1 of 3's


def test_kaudit_campaign_with_no_task_is_bad_input(project: Project) -> None:
    result = run_cli("campaign", "nothing", cwd=project.root)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "kaudit: error: campaign 'nothing': no array task of it in checkpoints (nothing.task-K)"
    ]
