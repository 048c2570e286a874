"""The ``scheduler`` record a run writes into its manifests under Slurm, from the job's
``SLURM_*`` environment; and the schema's bounds on it, since a manifest may come from
anyone (tests/slurm/test_requeue.py runs it under a real Slurm)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kronos_audit as ka
from kronos_audit._internal.canonical import canonical_json
from kronos_audit.errors import ManifestError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.provenance.scheduler import scheduler_record
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.statement.manifest import read_manifest
from tests.helpers import assert_bad_input, run_cli

SLURM_VARS = (
    "SLURM_JOB_ID",
    "SLURM_RESTART_COUNT",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "SLURM_JOB_PARTITION",
)


@pytest.fixture(autouse=True)
def no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever job the test session itself runs in, each test sets its own."""
    for var in SLURM_VARS:
        monkeypatch.delenv(var, raising=False)


def two_steps(root: Path) -> Path:
    with ka.Run("job", root=root, seed=1, every=ka.EverySteps(1)) as run:
        for step in run.steps(2):
            run.checkpoint(step, {"x": np.full(4, float(step))})
    return root / "job"


def test_a_manifest_written_in_a_slurm_job_records_the_job(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4240")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[01-04],gpu7")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "long")
    run_dir = two_steps(project.root / "checkpoints")
    m = read_manifest(run_dir / "step-00000002.h5.kaudit.json")
    assert m.predicate["scheduler"] == {
        "name": "slurm",
        "job_id": 4242,
        "restart_count": 3,
        "array_job_id": 4240,
        "array_task_id": 2,
        "nodelist": "node[01-04],gpu7",
        "partition": "long",
    }
    assert m.predicate["restart_count"] == 3
    assert m.record.scheduler is not None
    assert m.record.scheduler.job_id == 4242
    assert m.record.to_json_obj()["scheduler"] == m.predicate["scheduler"]
    assert all(r.ok for r in ka.verify(run_dir))
    shown = run_cli("show", str(m.path))
    assert "scheduler    slurm job 4242, requeued 3 time(s) (long, node[01-04],gpu7)" in (
        shown.stdout
    )
    assert "restarts     3" in shown.stdout


def test_no_scheduler_record_outside_slurm(project: Project, key: SigningKey) -> None:
    run_dir = two_steps(project.root / "checkpoints")
    m = read_manifest(run_dir / "step-00000001.h5.kaudit.json")
    assert "scheduler" not in m.predicate
    assert m.record.scheduler is None


def test_a_first_run_has_restart_count_0_and_what_slurm_did_not_set_is_left_out() -> None:
    record = scheduler_record({"SLURM_JOB_ID": "17", "SLURM_NODELIST": "vm"})
    assert record is not None
    assert record.to_json_obj() == {
        "name": "slurm",
        "job_id": 17,
        "restart_count": 0,
        "nodelist": "vm",
    }


@pytest.mark.parametrize(
    "environ",
    [
        {"SLURM_JOB_ID": "12 "},
        {"SLURM_JOB_ID": "-3"},
        {"SLURM_JOB_ID": "٣"},  # an Arabic-Indic digit: str.isdigit() says yes, Slurm never
        {"SLURM_JOB_ID": str(2**32)},
        {},
    ],
)
def test_no_record_without_a_job_id_slurm_could_have_written(environ: dict[str, str]) -> None:
    assert scheduler_record(environ) is None


def test_values_slurm_never_writes_are_left_out_not_recorded() -> None:
    record = scheduler_record(
        {
            "SLURM_JOB_ID": "5",
            "SLURM_RESTART_COUNT": "x",
            "SLURM_ARRAY_TASK_ID": "99999999999",
            "SLURM_JOB_NODELIST": "vm\x1b[2J",
            "SLURM_JOB_PARTITION": "p" * 257,
        }
    )
    assert record is not None
    assert record.to_json_obj() == {"name": "slurm", "job_id": 5, "restart_count": 0}


def test_a_job_id_in_the_environment_that_is_not_slurms_does_not_fail_the_checkpoint(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "not-a-number")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "debug")
    run_dir = two_steps(project.root / "checkpoints")
    assert "scheduler" not in read_manifest(run_dir / "step-00000002.h5.kaudit.json").predicate


@pytest.mark.parametrize(
    ("scheduler", "mentions"),
    [
        ({"name": "pbs", "job_id": 1, "restart_count": 0}, "name"),
        ({"name": "slurm", "job_id": "1", "restart_count": 0}, "job_id"),
        ({"name": "slurm", "job_id": 1}, "restart_count"),
        ({"name": "slurm", "job_id": 1, "restart_count": -1}, "restart_count"),
        ({"name": "slurm", "job_id": 2**32, "restart_count": 0}, "job_id"),
        ({"name": "slurm", "job_id": 1, "restart_count": 0, "nodelist": "vm\x1b[31m"}, "nodelist"),
        ({"name": "slurm", "job_id": 1, "restart_count": 0, "partition": ""}, "partition"),
        ({"name": "slurm", "job_id": 1, "restart_count": 0, "script": "rm -rf /"}, "script"),
        ("slurm", "scheduler"),
    ],
)
def test_the_schema_refuses_a_malformed_scheduler_record(
    project: Project, key: SigningKey, scheduler: Any, mentions: str
) -> None:
    run_dir = two_steps(project.root / "checkpoints")
    path = run_dir / "step-00000002.h5.kaudit.json"
    # Signed by a trusted key: only the schema stands between this record and a reader.
    statement = json.loads(read_manifest(path).envelope.payload)
    statement["predicate"]["scheduler"] = scheduler
    path.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), key)))
    with pytest.raises(ManifestError, match="scheduler") as caught:
        read_manifest(path)
    assert mentions in str(caught.value)
    assert_bad_input(run_cli("verify", str(path)), "scheduler")
