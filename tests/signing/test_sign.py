"""Signing a checkpoint whose digests are known (kronos_audit.signing.sign): what the runtime and
snapshot share."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from kronos_audit.checkpoint.hashing import digest_file
from kronos_audit.errors import ManifestError, UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.sign import publish_manifest, sign_checkpoint, utc_now
from kronos_audit.statement.manifest import encode_envelope, manifest_path_for, read_manifest
from kronos_audit.verification.verify import verify
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
