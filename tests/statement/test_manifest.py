"""Manifests: DSSE envelopes around in-toto Statements (kronos_audit.statement.manifest)."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import h5py
import jsonschema
import numpy as np
import pytest
from securesystemslib import dsse
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey

from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.safeio import MANIFEST_LIMIT
from kronos_audit.checkpoint.layout import checkpoint_path_for, manifest_path_for
from kronos_audit.errors import ManifestError
from kronos_audit.keys.home import generate_key
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.project.repository import Project
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.dsse import PAYLOAD_TYPE, encode_envelope, sign_envelope
from kronos_audit.statement.manifest import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    Manifest,
    load_json,
    parse_manifest,
    read_manifest,
    write_manifest,
)
from tests.helpers import git, write_checkpoint

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "schemas" / "manifest-v1.schema.json"


def schema_validator() -> jsonschema.Draft202012Validator:
    """The schema straight from the repository file, not through kaudit."""
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def statement_of(manifest_path: Path) -> dict[str, Any]:
    envelope = json.loads(manifest_path.read_text())
    statement: dict[str, Any] = json.loads(base64.b64decode(envelope["payload"]))
    return statement


def test_manifest_names() -> None:
    ckpt = Path("/runs/r1/step-1.h5")
    assert manifest_path_for(ckpt) == Path("/runs/r1/step-1.h5.kaudit.json")
    assert checkpoint_path_for(manifest_path_for(ckpt)) == ckpt
    for bad in ("/runs/r1/step-1.h5.json", "/runs/r1/.kaudit.json"):
        with pytest.raises(ManifestError, match=r"ends in \.kaudit\.json"):
            checkpoint_path_for(Path(bad))


def test_every_manifest_written_validates_against_the_schema_file(
    project: Project, key: SigningKey, tmp_path: Path
) -> None:
    root = project.root
    git(root, "remote", "add", "origin", "https://u:token@example.com/repo.git")
    first = write_checkpoint(root / "ck" / "step-1.h5", seed=1)
    with h5py.File(root / "ck" / "odd.h5", "w") as f:
        f["empty"] = h5py.Empty("f8")
        f["scalar"] = 1.5
        f["words"] = np.array(["a", "b"], dtype=h5py.string_dtype())
    blob = root / "ck" / "model.pt"
    blob.write_bytes(b"\x00torch-ish" * 100)
    written: list[Manifest] = []
    written += snapshot([first, root / "ck" / "odd.h5", blob], run="r", step=1, seeds=[1, 2])
    (root / "solver.py").write_text("print('dirty')\n")
    second = write_checkpoint(root / "ck" / "step-2.h5", seed=2)
    written += snapshot(
        second,
        run="r",
        step=2,
        parent=written[0].path,
        command=["python", "solver.py", "--resume"],
        attributes={"nodes": 4, "note": "x", "nested": {"a": [1, None]}},
        cwd=root / "ck",
    )
    validator = schema_validator()
    for m in written:
        statement = statement_of(m.path)
        errors = [e.message for e in validator.iter_errors(statement)]
        assert errors == [], m.path
        assert statement["_type"] == STATEMENT_TYPE
        assert statement["predicateType"] == PREDICATE_TYPE
    last = statement_of(written[-1].path)["predicate"]
    assert last["git"]["dirty"] is True
    assert last["git"]["remote"] == "https://example.com/repo.git"
    assert last["parent"] == hashlib.sha256(written[0].path.read_bytes()).hexdigest()
    assert last["cwd"] == "ck"
    assert statement_of(written[2].path)["predicate"]["datasets"] is None


def test_the_schema_file_is_the_one_kaudit_uses() -> None:
    from kronos_audit.statement.schemas import schema

    assert schema() == json.loads(SCHEMA_FILE.read_text())


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p.update(step=-1),
        lambda p: p.pop("git"),
        lambda p: p.update(run=""),
        lambda p: p.update(parent="not-a-digest"),
        lambda p: p.update(surprise=1),
        lambda p: p["datasets"][0].update(path="relative"),
        lambda p: p["git"].update(commit="HEAD"),
        lambda p: p.update(created="yesterday"),
    ],
    ids=["negative-step", "no-git", "empty-run", "bad-parent", "extra", "rel-path", "commit", "ts"],
)
def test_schema_violations_are_refused_on_write_and_on_read(
    project: Project, key: SigningKey, checkpoint: Path, mutate: Any
) -> None:
    (good,) = snapshot(checkpoint, run="r", step=1)
    statement = copy.deepcopy(statement_of(good.path))
    mutate(statement["predicate"])
    assert list(schema_validator().iter_errors(statement))  # the file's schema agrees
    envelope = sign_envelope(canonical_json(statement), key)
    target = checkpoint.with_name("bad.h5.kaudit.json")
    with pytest.raises(ManifestError, match="schema violation") as info:
        write_manifest(target, envelope)
    assert info.value.path == target
    assert not target.exists()
    assert not list(target.parent.glob(".kaudit-tmp-*"))
    target.write_bytes(encode_envelope(envelope))
    with pytest.raises(ManifestError, match="schema violation"):
        read_manifest(target)


def test_read_manifest_exposes_the_statement_read_only(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (written,) = snapshot(checkpoint, run="heat", step=1, seeds=[42])
    m = read_manifest(written.path)
    assert m == written
    assert m.digest == hashlib.sha256(written.path.read_bytes()).hexdigest()
    assert (m.run, m.step, m.parent) == ("heat", 1, None)
    assert m.subject_name == "checkpoints/run1/step-00000001.h5"
    assert m.subject_sha256 == hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert m.checkpoint_path == checkpoint
    assert m.envelope.payload_type == PAYLOAD_TYPE
    assert m.predicate["seeds"] == (42,)
    assert m.datasets is not None
    assert [d.path for d in m.datasets] == [
        "/fields/u",
        "/fields/v",
        "/labels",
        "/step",
        "/weights",
    ]
    with pytest.raises(TypeError):
        m.predicate["step"] = 8  # type: ignore[index]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"payloadType": "application/vnd.in-toto+json", "payl', "not valid JSON"),
        (b"\xff\xfe\x00garbage", "not UTF-8|not valid JSON"),
        (b'{"hello": "world"}', "not a DSSE envelope"),
        (b"[1, 2]", "not a DSSE envelope"),
    ],
)
def test_parse_manifest_rejects_what_is_not_a_manifest(data: bytes, message: str) -> None:
    with pytest.raises(ManifestError, match=message) as info:
        parse_manifest(data, Path("x.kaudit.json"))
    assert str(info.value).startswith("x.kaudit.json: ")


def test_parse_manifest_checks_payload_type_and_payload(key: SigningKey) -> None:
    other_type = sign_envelope(b"{}", key, payload_type="text/plain")
    with pytest.raises(ManifestError, match="payloadType is 'text/plain'"):
        parse_manifest(encode_envelope(other_type), Path("m.kaudit.json"))
    not_json = sign_envelope(b"\x00not json", key)
    with pytest.raises(ManifestError, match="payload: not valid JSON"):
        parse_manifest(encode_envelope(not_json), Path("m.kaudit.json"))


def test_read_manifest_of_a_missing_file_or_directory(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="manifest not found"):
        read_manifest(tmp_path / "gone.kaudit.json")
    with pytest.raises(ManifestError, match="is a directory"):
        read_manifest(tmp_path)


def test_read_manifest_reads_only_a_regular_file_where_it_is_found(
    project: Project, key: SigningKey, checkpoint: Path, tmp_path: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    link = tmp_path / "step-00000001.h5.kaudit.json"
    link.symlink_to(m.path)
    with pytest.raises(ManifestError, match="manifest is a symbolic link") as info:
        read_manifest(link)
    assert info.value.path == link
    fifo = tmp_path / "fifo.kaudit.json"
    os.mkfifo(fifo)
    with pytest.raises(ManifestError, match="manifest is a FIFO, not a regular file"):
        read_manifest(fifo)  # at once: it is never opened for a blocking read
    sparse = tmp_path / "sparse.kaudit.json"
    with sparse.open("wb") as f:
        f.truncate(MANIFEST_LIMIT + 1)
    with pytest.raises(ManifestError, match=f"more than the {MANIFEST_LIMIT:,} allowed"):
        read_manifest(sparse)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": 1, "a": 1}', "not valid JSON: duplicate key 'a' in an object"),
        ('{"a": [NaN]}', "not valid JSON: NaN is not a JSON number"),
        ('{"a": Infinity}', "not valid JSON: Infinity is not a JSON number"),
        ('{"a": ' + "9" * (MAX_INT_DIGITS + 1) + "}", "an integer of 4,301 digits"),
        ('{"a": ' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1), "nested more than"),
        ("[" * 50_000, "nested more than"),
    ],
    ids=["duplicate", "nan", "infinity", "long-integer", "deep", "very-deep"],
)
def test_load_json_is_strict(text: str, message: str) -> None:
    with pytest.raises(ManifestError, match=message) as info:
        load_json(text.encode(), Path("m.kaudit.json"), "payload")
    assert str(info.value).startswith("m.kaudit.json: payload: ")
    with pytest.raises(ManifestError, match=message):
        parse_manifest(text.encode(), Path("m.kaudit.json"))  # the envelope, the same way


def test_load_json_at_its_bounds() -> None:
    at_depth = '{"a": ' * (MAX_DEPTH - 1) + "[1]" + "}" * (MAX_DEPTH - 1)
    assert load_json(at_depth.encode(), Path("m")) is not None
    assert load_json(("-" + "9" * MAX_INT_DIGITS).encode(), Path("m")) < 0
    assert load_json(b'{"a": 1.5e300, "b": "\\u0000"}', Path("m")) == {"a": 1.5e300, "b": "\0"}


def test_a_kaudit_manifest_verifies_with_securesystemslib(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    public = SSlibKey.from_crypto(key.private_key.public_key(), keyid=key.key_id)
    envelope = dsse.Envelope.from_dict(json.loads(m.path.read_text()))
    accepted = envelope.verify([public], 1)
    assert set(accepted) == {key.key_id}
    assert envelope.payload_type == "application/vnd.in-toto+json"
    statement = json.loads(envelope.payload)
    assert statement["subject"][0]["digest"]["sha256"] == (
        hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    )


def test_securesystemslib_rejects_a_tampered_or_foreign_manifest(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    public = SSlibKey.from_crypto(key.private_key.public_key(), keyid=key.key_id)
    obj = json.loads(m.path.read_text())
    statement = json.loads(base64.b64decode(obj["payload"]))
    statement["predicate"]["step"] = 2
    obj["payload"] = base64.b64encode(canonical_json(statement)).decode()
    with pytest.raises(VerificationError):
        dsse.Envelope.from_dict(obj).verify([public], 1)

    stranger = generate_key("stranger")
    foreign = sign_envelope(canonical_json(statement), stranger).to_json_obj()
    foreign["signatures"][0]["keyid"] = key.key_id  # claiming to be the trusted signer
    with pytest.raises(VerificationError):
        dsse.Envelope.from_dict(foreign).verify([public], 1)


def test_dataset_hashes_match_plain_numpy(
    project: Project, key: SigningKey, checkpoint: Path
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    recorded = {d["path"]: d for d in statement_of(m.path)["predicate"]["datasets"]}
    with h5py.File(checkpoint) as f:
        for name in ("/fields/u", "/fields/v", "/weights", "/step"):
            arr = f[name][()]
            canon = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
            assert recorded[name]["sha256"] == hashlib.sha256(canon.tobytes()).hexdigest()
            assert recorded[name]["shape"] == list(arr.shape)
            assert recorded[name]["dtype"] == canon.dtype.str


def test_a_failed_write_leaves_the_old_manifest_and_no_temporary(
    project: Project, key: SigningKey, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (m,) = snapshot(checkpoint, run="r", step=1)
    before = m.path.read_bytes()
    statement = json.loads(m.envelope.payload)
    statement["predicate"]["attributes"] = {"second": True}
    envelope = sign_envelope(canonical_json(statement), key)
    fresh = checkpoint.with_name("other.h5.kaudit.json")

    def disk_error(fd: int) -> None:
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", disk_error)
        for target in (m.path, fresh):
            with pytest.raises(ManifestError, match="cannot write manifest: Input/output error"):
                write_manifest(target, envelope)
    assert m.path.read_bytes() == before
    assert not fresh.exists()
    assert not list(checkpoint.parent.glob(".kaudit-tmp-*"))
    write_manifest(fresh, envelope)
    assert read_manifest(fresh).predicate["attributes"]["second"] is True
