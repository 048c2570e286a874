"""Signing a checkpoint whose digests are known (kronos_audit.signing.sign): what the runtime and
snapshot share."""

from __future__ import annotations

import datetime as dt
import hashlib
import math
from typing import Any

import pytest

from kronos_audit._internal.canonical import canonical_json
from kronos_audit.checkpoint.hashing import digest_file
from kronos_audit.checkpoint.layout import INDEX_NAME, manifest_path_for, step_directory
from kronos_audit.checkpoint.shards import merkle_root
from kronos_audit.errors import ManifestError, UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.provenance.environment import environment
from kronos_audit.signing.predicate import RunRecord, utc_now
from kronos_audit.signing.sign import sign_checkpoint, sign_sharded_step
from kronos_audit.statement.dsse import encode_envelope
from kronos_audit.statement.manifest import build_statement, publish_manifest, read_manifest
from kronos_audit.statement.predicate import (
    Batches,
    GitRecord,
    PrunedEntry,
    RngRecord,
    SchedulerRecord,
    Sha256,
)
from kronos_audit.verification.batch import verify
from tests.helpers import write_checkpoint


def test_utc_now_is_rfc3339_utc() -> None:
    stamp = utc_now()
    assert stamp.endswith("Z")
    parsed = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    assert abs(dt.datetime.now(dt.UTC) - parsed) < dt.timedelta(minutes=5)


def test_a_manifest_is_made_and_checked_before_it_is_written(
    project: Project, key: SigningKey
) -> None:
    ckpt = write_checkpoint(project.root / "ck" / "step-00000003.h5", seed=3)
    digests = digest_file(ckpt, md5=True)
    m = sign_checkpoint(
        ckpt, digests, project=project, key=key, run="r", step=3, seeds=[7], write=False
    )
    assert m.path == manifest_path_for(ckpt)
    assert not m.path.exists()  # made and parsed as a reader would: nothing written yet
    assert (m.run, m.step, m.subject_sha256, m.datasets) == (
        "r",
        3,
        digests.sha256,
        digests.datasets,
    )
    assert publish_manifest(m) is m
    assert m.path.read_bytes() == encode_envelope(m.envelope)  # the bytes its digest is of
    assert read_manifest(m.path) == m
    (result,) = verify(m.path)
    assert result.ok, result.failures


def test_what_a_reader_would_refuse_is_refused_before_anything_is_written(
    project: Project, key: SigningKey
) -> None:
    ckpt = write_checkpoint(project.root / "ck" / "c.h5")
    with pytest.raises(UsageError, match="cannot be signed") as info:
        sign_checkpoint(
            ckpt,
            digest_file(ckpt),
            project=project,
            key=key,
            run="r",
            step=1,
            attributes={"loss": math.nan},
        )
    assert info.value.path == ckpt
    assert not manifest_path_for(ckpt).exists()


def test_the_parent_must_be_an_earlier_step_of_the_same_run(
    project: Project, key: SigningKey
) -> None:
    a = write_checkpoint(project.root / "ck" / "a.h5", seed=1)
    b = write_checkpoint(project.root / "ck" / "b.h5", seed=2)
    parent = sign_checkpoint(a, digest_file(a), project=project, key=key, run="r", step=5)
    child = sign_checkpoint(
        b, digest_file(b), project=project, key=key, run="r", step=6, parent=parent
    )
    assert child.parent == parent.digest
    assert child.predicate["parent_manifest"] == "ck/a.h5.kaudit.json"
    with pytest.raises(UsageError, match="parent is at step 5, not before step 5"):
        sign_checkpoint(
            b,
            digest_file(b),
            project=project,
            key=key,
            run="r",
            step=5,
            parent=a.with_name("a.h5.kaudit.json"),
        )
    with pytest.raises(UsageError, match="parent belongs to run 'r', not 's'"):
        sign_checkpoint(b, digest_file(b), project=project, key=key, run="s", step=6, parent=parent)


def test_a_manifest_that_cannot_be_written_is_a_manifest_error(
    project: Project, key: SigningKey
) -> None:
    ckpt = write_checkpoint(project.root / "ck" / "c.h5")
    manifest_path_for(ckpt).mkdir()  # something in the way
    with pytest.raises(ManifestError, match="cannot write manifest"):
        sign_checkpoint(ckpt, digest_file(ckpt), project=project, key=key, run="r", step=1)


# -- the typed predicate signs the bytes the dict literals signed ---------------------------

CREATED = "2026-11-29T08:00:00.123456Z"
GIT = GitRecord(
    commit="c" * 40, branch="main", dirty=True, patch_sha256=Sha256("d" * 64), remote=None
)
RUN_RECORD = RunRecord(
    rng={
        "numpy": RngRecord("/rng/numpy", "PCG64"),
        "python": RngRecord("/rng/python", None),
    },
    restart_count=2,
    batches=Batches(total=10, done=3),
    scheduler=SchedulerRecord(name="slurm", job_id=42, restart_count=2, partition="gpu"),
    pruned=(PrunedEntry(1, Sha256("e" * 64)),),
)
RUNTIME_EXTRA = {  # what the runtime handed the predicate, as JSON, before it was typed
    "rng": {
        "numpy": {"dataset": "/rng/numpy", "bit_generator": "PCG64"},
        "python": {"dataset": "/rng/python"},
    },
    "restart_count": 2,
    "batches": {"total": 10, "done": 3},
    "scheduler": {"name": "slurm", "job_id": 42, "restart_count": 2, "partition": "gpu"},
    "pruned": [{"step": 1, "manifest": "e" * 64}],
}


def _payload(subject: str, sha256: str, md5: str | None, predicate: dict[str, Any]) -> bytes:
    return canonical_json(
        build_statement(subject_name=subject, sha256=sha256, md5=md5, predicate=predicate)
    )


@pytest.mark.parametrize("from_a_run", [False, True], ids=["snapshot", "run"])
def test_a_checkpoint_signs_the_predicate_the_dict_literal_signed(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch, from_a_run: bool
) -> None:
    a = write_checkpoint(project.root / "ck" / "a.h5", seed=1)
    b = write_checkpoint(project.root / "ck" / "b.h5", seed=2)
    parent = sign_checkpoint(a, digest_file(a), project=project, key=key, run="heat", step=5)
    digests = digest_file(b, md5=True)
    assert digests.datasets is not None
    attributes = {"nodes": 4, "mesh": {"n": [64, 64]}, "tag": ("x", 1.5)}
    monkeypatch.chdir(project.root / "ck")
    m = sign_checkpoint(
        b,
        digests,
        project=project,
        key=key,
        run="heat",
        step=6,
        seeds=[7, 8],
        parent=parent,
        command=["python", "sim.py", 3],  # type: ignore[list-item]
        attributes=attributes,
        record=RUN_RECORD if from_a_run else None,
        created=CREATED,
        git=GIT,
        write=False,
    )
    # The predicate as signing.sign built it by hand, before the typed predicate wrote it.
    expected: dict[str, Any] = {
        "run": "heat",
        "step": 6,
        "parent": parent.digest,
        "parent_manifest": "ck/a.h5.kaudit.json",
        "created": CREATED,
        "size": digests.size,
        "git": GIT.to_json_obj(),
        "environment": environment(),
        "seeds": [7, 8],
        "datasets": [d.to_json_obj(extent=True) for d in digests.datasets],
        "attributes": dict(attributes),
        "command": ["python", "sim.py", "3"],
        "cwd": "ck",
        **(RUNTIME_EXTRA if from_a_run else {}),
    }
    assert m.envelope.payload == _payload("ck/b.h5", digests.sha256, digests.md5, expected)


def test_a_sharded_step_signs_the_predicate_the_dict_literal_signed(
    project: Project, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.checkpoint.test_shards import write_shards

    directory = step_directory(project.root / "checkpoints" / "heat", 3)
    records = write_shards(directory, 3, 2)
    layout = {"u": {"block": 0, "shape": [12, 4]}, "t": {"replicated": True}}
    monkeypatch.chdir(project.root)
    m = sign_sharded_step(
        directory,
        records,
        project=project,
        key=key,
        run="heat",
        step=3,
        layout=layout,
        launcher="mpi",
        seeds=[7],
        command=["mpiexec", "python", "heat.py"],
        record=RunRecord(rng=RUN_RECORD.rng, restart_count=0, batches=RUN_RECORD.batches),
        created=CREATED,
        git=GIT,
        write=False,
    )
    data = (directory / INDEX_NAME).read_bytes()
    expected = {
        "run": "heat",
        "step": 3,
        "parent": None,
        "parent_manifest": None,
        "created": CREATED,
        "size": len(data),
        "git": GIT.to_json_obj(),
        "environment": environment(),
        "seeds": [7],
        "datasets": None,
        "attributes": {},
        "command": ["mpiexec", "python", "heat.py"],
        "cwd": ".",
        "rng": RUNTIME_EXTRA["rng"],
        "batches": RUNTIME_EXTRA["batches"],
        "restart_count": 0,
        "shards": {
            "count": 2,
            "bytes": sum(r.size for r in records),
            "root": merkle_root(data, 2),
            "layout": layout,
            "launcher": "mpi",
        },
    }
    assert m.envelope.payload == _payload(
        project.relative(directory / INDEX_NAME),
        hashlib.sha256(data).hexdigest(),
        hashlib.md5(data, usedforsecurity=False).hexdigest(),
        expected,
    )
