"""Verification: signature, file digest, dataset hashes, parent chain
(kronos_audit.verification.verifier).

Tampering is checked through `kaudit verify` as well as the library: each must exit 1 and
name exactly the checks that failed.
"""

from __future__ import annotations

import ast
import base64
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from kronos_audit._internal.canonical import canonical_json
from kronos_audit.checkpoint.hashing import DatasetDigest
from kronos_audit.checkpoint.location import Location
from kronos_audit.errors import CheckpointError, ManifestError, StorageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.dsse import encode_envelope, sign_envelope
from kronos_audit.statement.manifest import Manifest
from kronos_audit.storage import cache_object_path, cache_settings
from kronos_audit.verification.batch import verify
from kronos_audit.verification.results import Check, CheckName, CheckStatus, StatementKind
from kronos_audit.verification.steps import compare_datasets
from kronos_audit.verification.verifier import Verifier
from tests.helpers import run_cli, untrusted_key, write_checkpoint


def failed_checks(manifest: Path) -> set[str]:
    """Run `kaudit verify` on ``manifest``; require exit 1 and return the failed checks."""
    human = run_cli("verify", str(manifest))
    assert human.exit_code == 1, human.output
    assert f"FAIL {manifest}" in human.stdout
    as_json = run_cli("verify", "--json", str(manifest))
    assert as_json.exit_code == 1
    report = json.loads(as_json.stdout)
    assert report["ok"] is False
    assert report["errors"] == []
    (result,) = report["results"]
    failed = {c["check"] for c in result["checks"] if not c["ok"]}
    for name in failed:
        assert f"{name}: " in human.stdout  # the human output names each failed check
    (library,) = verify(manifest)
    assert {c.name for c in library.failures} == failed
    return failed


def detail(manifest: Path, check: str) -> str:
    (result,) = verify(manifest)
    (found,) = [c for c in result.checks if c.name == check]
    return found.detail


def chain(project: Project, n: int, run: str = "run1") -> list[Manifest]:
    manifests: list[Manifest] = []
    for step in range(1, n + 1):
        ckpt = write_checkpoint(project.root / "checkpoints" / run / f"step-{step}.h5", seed=step)
        parent = manifests[-1].path if manifests else None
        manifests += snapshot(ckpt, run=run, step=step, parent=parent)
    return manifests


def rewrite_payload(manifest: Path, change: Any) -> None:
    """Decode the payload, change the statement, re-encode it; keep the old signature."""
    envelope = json.loads(manifest.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    change(statement["predicate"])
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    manifest.write_text(json.dumps(envelope, indent=2))


def test_an_untouched_manifest_verifies(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    (result,) = verify(m.path)
    assert result.ok
    assert (result.manifest, result.checkpoint, result.run, result.step) == (
        m.path,
        checkpoint,
        "r",
        1,
    )
    assert [c.name for c in result.checks] == [
        "signature",
        "place",
        "file digest",
        "datasets",
        "parent link",
    ]
    assert result.failures == ()
    ok = run_cli("verify", str(m.path))
    assert ok.exit_code == 0
    assert f"ok   {m.path}" in ok.stdout
    assert ok.stderr == ""


def test_a_flipped_byte_in_a_dataset_fails_file_digest_and_that_dataset(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    with h5py.File(checkpoint) as f:
        dset = f["fields/u"]
        assert dset.chunks is None  # contiguous: its bytes sit at one offset in the file
        offset = dset.id.get_offset() + 8 * 100 + 3
    data = bytearray(checkpoint.read_bytes())
    data[offset] ^= 0x01
    checkpoint.write_bytes(bytes(data))
    assert failed_checks(m.path) == {"file digest", "dataset /fields/u"}
    assert "differs from the recorded" in detail(m.path, "dataset /fields/u")


def test_a_rewritten_dataset_fails_only_that_dataset_hash(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    with h5py.File(checkpoint, "r+") as f:
        f["weights"][0, 0] += 1  # chunked and compressed
    assert failed_checks(m.path) == {"file digest", "dataset /weights"}


def test_a_changed_predicate_with_the_old_signature_fails_the_signature(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1, seeds=[1])
    rewrite_payload(m.path, lambda p: p.update(step=2))
    # The file's name says step 1: the place contradicts the (forged) step 2 too.
    assert failed_checks(m.path) == {"signature", "place"}
    assert "does not match the payload" in detail(m.path, "signature")
    rewrite_payload(m.path, lambda p: p.update(step=1, seeds=[666]))
    assert failed_checks(m.path) == {"signature"}


def test_a_manifest_signed_by_an_untrusted_key_fails_the_signature(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    stranger = untrusted_key("stranger")  # held, but not in the trust store
    (m,) = snapshot(checkpoint, run="r", step=1, key="stranger")
    assert failed_checks(m.path) == {"signature"}
    assert f"no trust anchor holds: {stranger.key_id[:16]}" in detail(m.path, "signature")


def test_a_swapped_signature_fails_the_signature(project: Project, key: SigningKey) -> None:
    a, b = chain(project, 2)
    donor = json.loads(b.path.read_text())
    victim = json.loads(a.path.read_text())
    assert victim["signatures"][0]["sig"] != donor["signatures"][0]["sig"]
    victim["signatures"][0]["sig"] = donor["signatures"][0]["sig"]
    a.path.write_text(json.dumps(victim))
    assert failed_checks(a.path) == {"signature"}


def test_a_deleted_parent_manifest_fails_the_childs_parent_link(
    project: Project, key: SigningKey
) -> None:
    first, second = chain(project, 2)
    first.path.unlink()
    assert failed_checks(second.path) == {"parent link"}
    assert "is missing" in detail(second.path, "parent link")


def test_an_altered_parent_manifest_fails_the_childs_parent_link(
    project: Project, key: SigningKey
) -> None:
    first, second = chain(project, 2)
    rewrite_payload(first.path, lambda p: p.update(seeds=[7]))
    assert failed_checks(second.path) == {"parent link"}
    assert "was altered" in detail(second.path, "parent link")


def test_a_validly_signed_replacement_parent_is_still_not_the_parent(
    project: Project, key: SigningKey
) -> None:
    """The digest is the link: a parent re-signed by a trusted key, or merely re-indented,
    is a different file from the one the child names."""
    first, second = chain(project, 2)
    original = first.path.read_bytes()
    first.path.write_text(json.dumps(json.loads(original)))  # same envelope, other bytes
    (parent_alone,) = verify(first.path)
    assert parent_alone.ok  # it is still a valid manifest in its own right
    assert failed_checks(second.path) == {"parent link"}
    assert "was altered" in detail(second.path, "parent link")

    statement = json.loads(first.envelope.payload)
    statement["predicate"]["attributes"] = {"rewritten": True}
    first.path.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), key)))
    assert verify(first.path)[0].ok
    assert failed_checks(second.path) == {"parent link"}

    first.path.write_bytes(original)
    assert verify(second.path)[0].ok


def test_a_chain_of_three_verifies(project: Project, key: SigningKey) -> None:
    manifests = chain(project, 3)
    assert manifests[1].parent == manifests[0].digest
    assert manifests[2].parent == manifests[1].digest
    results = verify([m.path for m in manifests])
    assert all(r.ok for r in results)
    links = [next(c for c in r.checks if c.name == "parent link").detail for r in results]
    assert links == [
        "first checkpoint of its chain",
        "chain of 2 manifests back to step 1 verifies",
        "chain of 3 manifests back to step 1 verifies",
    ]
    # The verifier remembers links already walked; what it says must not depend on order.
    backwards = verify([m.path for m in reversed(manifests)])
    assert [next(c for c in r.checks if c.name == "parent link").detail for r in backwards] == (
        links[::-1]
    )


def test_a_broken_link_deep_in_the_chain_fails_the_last_manifest(
    project: Project, key: SigningKey
) -> None:
    first, _, third = chain(project, 3)
    first.path.unlink()
    assert failed_checks(third.path) == {"parent link"}


def test_an_untrusted_parent_fails_the_childs_parent_link(
    project: Project, key: SigningKey
) -> None:
    untrusted_key("stranger")
    a = write_checkpoint(project.root / "ck" / "a.h5", seed=1)
    b = write_checkpoint(project.root / "ck" / "b.h5", seed=2)
    (ma,) = snapshot(a, run="r", step=1, key="stranger")
    (mb,) = snapshot(b, run="r", step=2, parent=ma.path, key="tester")
    assert failed_checks(mb.path) == {"parent link"}
    assert "no trust anchor holds" in detail(mb.path, "parent link")


def test_verifying_a_directory_verifies_every_manifest_in_it(
    project: Project, key: SigningKey
) -> None:
    manifests = chain(project, 3)
    results = verify(project.root / "checkpoints")
    assert sorted(r.manifest for r in results) == sorted(m.path for m in manifests)
    assert all(r.ok for r in results)
    cli = run_cli("verify", "--json", str(project.root / "checkpoints"))
    assert cli.exit_code == 0
    assert len(json.loads(cli.stdout)["results"]) == 3


def test_an_empty_directory_is_bad_input(project: Project, tmp_path: Path) -> None:
    (project.root / "empty").mkdir()
    with pytest.raises(ManifestError, match="no manifest"):
        verify(project.root / "empty")


def test_a_run_directory_moved_as_a_whole_still_verifies(project: Project, key: SigningKey) -> None:
    manifests = chain(project, 3)
    old = project.root / "checkpoints" / "run1"
    new = project.root / "archive" / "2026" / "run1"
    new.parent.mkdir(parents=True)
    shutil.move(old, new)
    results = verify(new)
    assert len(results) == 3
    assert all(r.ok for r in results), [r.failures for r in results]
    # Moving only the child (into a directory of its run's name) loses its parent: there
    # is nothing beside it.
    lone = project.root / "lone" / "run1"
    lone.mkdir(parents=True)
    shutil.move(new / "step-3.h5", lone / "step-3.h5")
    shutil.move(new / "step-3.h5.kaudit.json", lone / "step-3.h5.kaudit.json")
    assert manifests[2].path.name == "step-3.h5.kaudit.json"
    assert failed_checks(lone / "step-3.h5.kaudit.json") == {"parent link"}


def test_a_missing_checkpoint_is_bad_input(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    original = checkpoint.read_bytes()
    checkpoint.unlink()
    # DVC's cache still holds the signed md5's object: verify takes it from there, checked.
    (result,) = verify(m.path)
    assert result.ok
    assert result.fetched
    assert checkpoint.read_bytes() == original
    checkpoint.unlink()
    assert m.subject_md5 is not None
    cache_object_path(cache_settings(project)[0], m.subject_md5).unlink()
    # Not in the cache either: the remote is asked, and there is none.
    with pytest.raises(StorageError, match="no DVC remote") as fetching:
        verify(m.path)
    assert fetching.value.exit_code == 2
    assert fetching.value.path == checkpoint
    with pytest.raises(CheckpointError, match="checkpoint file not found") as info:
        verify(m.path, fetch=False)
    assert info.value.exit_code == 2
    assert info.value.path == checkpoint


def test_a_checkpoint_that_no_longer_parses_fails_checks(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    checkpoint.write_bytes(checkpoint.read_bytes()[:2000])
    assert failed_checks(m.path) == {"file digest", "datasets"}
    assert "not a readable HDF5 file" in detail(m.path, "datasets")


def test_a_checkpoint_replaced_by_another_kind_of_file_fails(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    checkpoint.write_bytes(b"plain bytes")
    assert failed_checks(m.path) == {"file digest", "datasets"}
    assert "not an HDF5 file" in detail(m.path, "datasets")


def test_a_schema_violation_signed_by_a_trusted_key_is_bad_input(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    changes: list[Callable[[dict[str, Any]], object]] = [
        lambda p: p.update(step=-1),
        lambda p: p.pop("git"),
    ]
    for change in changes:
        statement = json.loads(m.envelope.payload)
        change(statement["predicate"])
        m.path.write_bytes(encode_envelope(sign_envelope(canonical_json(statement), key)))
        with pytest.raises(ManifestError, match="schema violation"):
            verify(m.path)
        result = run_cli("verify", str(m.path))
        assert result.exit_code == 2
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"kaudit: error: {m.path}: schema violation")


def digest(path: str, dtype: str = "<f8", shape: tuple[int, ...] = (2,), h: str = "a") -> Any:
    return DatasetDigest(path, dtype, shape, h * 64)


def test_compare_datasets_names_every_difference() -> None:
    recorded = (digest("/a"), digest("/b"), digest("/c"), digest("/d"))
    actual = (digest("/a"), digest("/b", h="b"), digest("/c", dtype="<f4"), digest("/e"))
    checks = compare_datasets(recorded, actual)
    assert [(c.name, c.ok) for c in checks] == [
        ("dataset /b", False),
        ("dataset /c", False),
        ("dataset /d", False),
        ("dataset /e", False),
    ]
    assert "recorded <f8[2]" in checks[1].detail
    assert "missing" in checks[2].detail
    assert "not in the manifest" in checks[3].detail
    assert compare_datasets(recorded, recorded) == [
        Check(CheckName("datasets"), True, "all 4 dataset hashes match")
    ]
    assert compare_datasets(None, None)[0].ok
    assert not compare_datasets(None, recorded)[0].ok
    assert not compare_datasets(recorded, None)[0].ok


def test_an_added_dataset_fails(project: Project, key: SigningKey, checkpoint: Path) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    with h5py.File(checkpoint, "r+") as f:
        f["smuggled"] = np.zeros(3)
    assert failed_checks(m.path) == {"file digest", "dataset /smuggled"}


def test_result_json_shape(project: Project, key: SigningKey, checkpoint: Path) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    obj = verify(m.path)[0].to_json_obj()
    assert obj["ok"] is True
    assert obj["manifest"] == str(m.path)
    assert obj["checkpoint"] == str(checkpoint)
    assert {c["check"] for c in obj["checks"]} == {
        "signature",
        "place",
        "file digest",
        "datasets",
        "parent link",
    }


# -- check names: an enum, and properties on the result ------------------------------------


def test_check_names_print_and_serialise_as_before() -> None:
    assert [c.value for c in CheckName] == [
        "signature",
        "place",
        "file digest",
        "datasets",
        "dataset",
        "parent link",
        "manifest",
        "outcome",
        "shard index",
        "batches",
        "tally",
        "shards",
        "files",
        "ledger",
    ]
    u = Check(CheckName.DATASET, False, "content differs", dataset="/fields/u")
    assert u.name == "dataset /fields/u"
    assert u.to_json_obj() == {
        "check": "dataset /fields/u",
        "ok": False,
        "skipped": False,
        "detail": "content differs",
    }
    digest_check = Check(CheckName.FILE_DIGEST, True, "matches")
    assert digest_check.name == "file digest"
    assert f"{digest_check.kind}: x" == "file digest: x"
    # A plain string naming a check is taken as its kind (and only a check's name is).
    assert Check("parent link", True, "").kind is CheckName.PARENT_LINK  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is not a valid CheckName"):
        Check("dataset /fields/u", True, "")  # type: ignore[arg-type]


def test_a_dataset_check_names_its_dataset_and_only_it_does() -> None:
    with pytest.raises(ValueError, match="dataset"):
        Check(CheckName.DATASET, False, "differs")
    with pytest.raises(ValueError, match="dataset"):
        Check(CheckName.DATASETS, False, "differs", dataset="/fields/u")
    (check,) = compare_datasets((digest("/a"),), (digest("/a", h="b"),))
    assert (check.kind, check.dataset) == (CheckName.DATASET, "/a")


def test_a_check_is_in_one_of_four_states_and_says_them_as_ok_and_skipped() -> None:
    made = Check(CheckName.SIGNATURE, True, "signed"), Check(CheckName.PLACE, False, "moved")
    assert [c.status for c in made] == [CheckStatus.PASSED, CheckStatus.FAILED]
    skip = Check.skip(CheckName.FILE_DIGEST, "pruned", pruned=True)
    unverified = Check.unverified(CheckName.FILE_DIGEST, "not fetched")
    states = [(c.status, c.ok, c.skipped) for c in (*made, skip, unverified)]
    assert states == [
        (CheckStatus.PASSED, True, False),
        (CheckStatus.FAILED, False, False),
        (CheckStatus.SKIPPED, True, True),
        (CheckStatus.UNVERIFIED, False, True),
    ]
    assert skip.to_json_obj() == {
        "check": "file digest",
        "ok": True,
        "skipped": True,
        "detail": "pruned",
    }
    with pytest.raises(ValueError, match="not made"):
        Check(CheckName.FILE_DIGEST, True, "matches", pruned=True)


def test_the_result_says_what_its_checks_found(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    (good,) = verify(m.path)
    assert good.kind is StatementKind.MANIFEST
    assert not good.is_attestation
    assert good.data_checked
    assert not good.data_corrupt
    assert good.data is Location.LOCAL
    signature = good.signature_check
    assert signature is not None
    assert signature.ok
    assert signature is good.checks[0]
    assert good.check(CheckName.PARENT_LINK) is good.checks[-1]
    assert good.check(CheckName.OUTCOME) is None  # a manifest has no outcome

    with h5py.File(checkpoint, "r+") as f:
        f["weights"][0, 0] += 1
    (bad,) = verify(m.path)
    assert bad.data_checked
    assert bad.data_corrupt
    assert bad.data is Location.CORRUPT
    file_digest = bad.check(CheckName.FILE_DIGEST)
    assert file_digest is not None
    assert not file_digest.ok
    assert [c.kind for c in bad.failures] == [CheckName.FILE_DIGEST, CheckName.DATASET]

    unread = Verifier(project).verify(m.path, data=False)
    assert not unread.data_checked
    assert not unread.data_corrupt
    assert unread.data is None  # not looked at
    skipped = unread.check(CheckName.FILE_DIGEST)
    assert skipped is not None
    assert skipped.skipped
    assert skipped.ok


def test_data_not_fetched_for_a_manifest_that_does_not_verify_is_missing(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1, key=untrusted_key("mallory"))
    checkpoint.unlink()
    (result,) = verify(m.path)
    digest = result.check(CheckName.FILE_DIGEST)
    assert digest is not None
    assert digest.status is CheckStatus.UNVERIFIED
    assert result.data is Location.MISSING
    assert result.to_json_obj()["data"] == "missing"


CHECK_NAMES = frozenset(c.value for c in CheckName)


def check_name_comparisons(source: str) -> list[int]:
    """Lines of ``source`` that compare ``something.name`` with a check's name as a string
    (``c.name == "file digest"``) instead of using CheckName and the result's properties."""
    found: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        names = any(isinstance(x, ast.Attribute) and x.attr == "name" for x in sides)
        literal = any(
            isinstance(x, ast.Constant)
            and isinstance(x.value, str)
            and (x.value in CHECK_NAMES or x.value.startswith("dataset /"))
            for x in sides
        )
        if names and literal:
            found.append(node.lineno)
    return sorted(found)


def test_the_scanner_finds_check_names_compared_as_strings() -> None:
    source = (
        'a = c.name == "file digest"\n'
        'b = "signature" != check.name\n'
        'c = c.name == "dataset /fields/u"\n'
        "d = c.kind is CheckName.FILE_DIGEST\n"
        'e = path.name == "step-1.h5"\n'
    )
    assert check_name_comparisons(source) == [1, 2, 3]


def test_the_package_never_compares_check_names_as_strings() -> None:
    package = Path(__file__).resolve().parents[2] / "kronos_audit"
    offenders = {
        str(path.relative_to(package)): lines
        for path in sorted(package.rglob("*.py"))
        if (lines := check_name_comparisons(path.read_text(encoding="utf-8")))
    }
    assert not offenders, offenders
