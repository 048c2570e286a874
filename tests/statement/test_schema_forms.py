"""The manifest schema's per-dataset part is spelled for speed, and means what it meant.

``predicate.datasets`` is checked once per dataset of a checkpoint (thousands, for some
programs), at signing and at every read. It used to say "null, or an array of ..." as a
``oneOf`` of the two (so jsonschema tried both branches), a dataset's ``shape`` the same
way, and its ``sha256`` as a ``$ref`` to ``#/$defs/sha256`` (a reference looked up per
dataset). The shipped schema now says the same with a type list and ``items``, and the
sha256 pattern inline. Here the old spelling, rebuilt from the shipped schema, and the
shipped one must agree on every document: the valid ones kaudit writes, and every way the
part can be wrong (each of which both must refuse).
"""

from __future__ import annotations

import base64
import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import jsonschema
import numpy as np
import pytest

from kronos_audit.errors import ManifestError
from kronos_audit.keys.home import generate_key
from kronos_audit.project.repository import find_project
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.schemas import schema, validate
from tests.conftest import isolate

SHA = "0123456789abcdef" * 4


def as_before(shipped: dict[str, Any]) -> dict[str, Any]:
    """The shipped manifest schema with ``predicate.datasets`` spelled as it was."""
    old = copy.deepcopy(shipped)
    datasets = old["$defs"]["predicate"]["properties"]["datasets"]
    item = datasets.pop("items")
    assert datasets.pop("type") == ["array", "null"]
    item["properties"]["shape"] = {
        "oneOf": [
            {"type": "null"},
            {"type": "array", "items": item["properties"]["shape"].pop("items")},
        ]
    }
    assert item["properties"]["sha256"] == old["$defs"]["sha256"]  # the same pattern, inline
    item["properties"]["sha256"] = {"$ref": "#/$defs/sha256"}
    datasets["oneOf"] = [{"type": "null"}, {"type": "array", "items": item}]
    return old


def validator(contents: dict[str, Any]) -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(contents)
    return jsonschema.Draft202012Validator(
        contents, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


SHIPPED = validator(schema())
BEFORE = validator(as_before(schema()))


@pytest.fixture(scope="module")
def written(
    tmp_path_factory: pytest.TempPathFactory, repo_templates: tuple[Path, Path]
) -> dict[str, Any]:
    """The statement kaudit signs of a checkpoint with every kind of dataset shape: an
    array, an empty array, a scalar (shape []), an empty dataspace (shape null). Signed once
    for the module, in a project and key directory of its own."""
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp_path_factory.mktemp)
        root = tmp_path_factory.mktemp("forms") / "repo"
        shutil.copytree(repo_templates[1], root, symlinks=True)
        key = generate_key("tester")
        find_project(root).trust_store().add(key.private_key.public_key(), "tester")
        path = root / "ck" / "step-1.h5"
        path.parent.mkdir()
        with h5py.File(path, "w") as f:
            f["fields/u"] = np.zeros((3, 4))
            f["none"] = np.zeros((0, 2))
            f["scalar"] = 1.5
            f["empty"] = h5py.Empty("f8")
        (manifest,) = snapshot(path, run="r", step=1)
    envelope = json.loads(manifest.path.read_text())
    statement: dict[str, Any] = json.loads(base64.b64decode(envelope["payload"]))
    shapes = {d["path"]: d["shape"] for d in statement["predicate"]["datasets"]}
    assert shapes == {"/empty": None, "/fields/u": [3, 4], "/none": [0, 2], "/scalar": []}
    return statement


def dataset(doc: dict[str, Any]) -> dict[str, Any]:
    first: dict[str, Any] = doc["predicate"]["datasets"][0]
    return first


def put(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: dataset(doc).update({key: value})


def drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda doc: dataset(doc).pop(key)


def datasets_are(value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: doc["predicate"].update(datasets=value)


VALID: dict[str, Callable[[dict[str, Any]], None]] = {
    "as-written": lambda doc: None,
    "datasets-null": datasets_are(None),
    "datasets-empty": datasets_are([]),
    "shape-null": put("shape", None),
    "shape-scalar": put("shape", []),
    "shape-zero": put("shape", [0, 7]),
    "shape-big": put("shape", [2**40]),
    "other-sha256": put("sha256", SHA),
}

REFUSED: dict[str, Callable[[dict[str, Any]], None]] = {
    # predicate.datasets itself: null or an array, nothing else
    "datasets-string": datasets_are("[]"),
    "datasets-object": datasets_are({}),
    "datasets-number": datasets_are(0),
    "datasets-true": datasets_are(True),
    "datasets-false": datasets_are(False),
    # each item: an object of exactly the four keys
    "item-null": datasets_are([None]),
    "item-string": datasets_are(["/u"]),
    "item-array": datasets_are([[]]),
    "no-path": drop("path"),
    "no-dtype": drop("dtype"),
    "no-shape": drop("shape"),
    "no-sha256": drop("sha256"),
    "extra-key": put("md5", "0" * 32),
    # path: a string starting with /
    "path-relative": put("path", "u"),
    "path-number": put("path", 1),
    "path-null": put("path", None),
    # dtype: a non-empty string
    "dtype-empty": put("dtype", ""),
    "dtype-number": put("dtype", 8),
    # shape: null, or an array of integers of at least 0
    "shape-string": put("shape", "[3]"),
    "shape-number": put("shape", 3),
    "shape-true": put("shape", True),
    "shape-object": put("shape", {}),
    "shape-negative": put("shape", [3, -1]),
    "shape-float": put("shape", [1.5]),
    "shape-bool": put("shape", [True]),
    "shape-string-item": put("shape", ["3"]),
    "shape-null-item": put("shape", [None]),
    "shape-nested": put("shape", [[3]]),
    # sha256: 64 lowercase hex digits
    "sha-upper": put("sha256", SHA.upper()),
    "sha-short": put("sha256", SHA[:-1]),
    "sha-long": put("sha256", SHA + "0"),
    "sha-not-hex": put("sha256", "g" + SHA[1:]),
    "sha-number": put("sha256", 1),
    "sha-null": put("sha256", None),
    "sha-array": put("sha256", [SHA]),
    # a later item wrong, the first right
    "second-item": lambda doc: doc["predicate"]["datasets"].append({"path": "/x"}),
}


ALIKE: dict[str, Callable[[dict[str, Any]], None]] = {
    **VALID,
    **REFUSED,
    # Python's $ matches before a final newline: whatever the verdict, both give the same.
    "sha-newline": put("sha256", SHA + "\n"),
    "path-newline": put("path", "/u\n"),
}


def document(written: dict[str, Any], mutate: Callable[[dict[str, Any]], None]) -> Any:
    doc = copy.deepcopy(written)
    mutate(doc)
    return doc


def test_the_old_spelling_differs_from_the_shipped_one() -> None:
    # Otherwise the tests below would compare the schema with itself.
    assert as_before(schema()) != schema()
    assert "oneOf" not in schema()["$defs"]["predicate"]["properties"]["datasets"]


@pytest.mark.parametrize("name", sorted(VALID))
def test_both_spellings_accept_what_kaudit_writes(written: dict[str, Any], name: str) -> None:
    doc = document(written, VALID[name])
    assert BEFORE.is_valid(doc)
    assert SHIPPED.is_valid(doc)
    validate(doc)  # what kaudit itself checks


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_both_spellings_refuse_every_wrong_dataset(written: dict[str, Any], name: str) -> None:
    doc = document(written, REFUSED[name])
    assert not BEFORE.is_valid(doc)
    assert not SHIPPED.is_valid(doc)
    with pytest.raises(ManifestError, match="schema violation at predicate/datasets"):
        validate(doc)


@pytest.mark.parametrize("name", sorted(ALIKE))
def test_both_spellings_judge_the_same_whatever_the_verdict(
    written: dict[str, Any], name: str
) -> None:
    doc = document(written, ALIKE[name])
    assert BEFORE.is_valid(doc) == SHIPPED.is_valid(doc)


EXTENTS_AND_ATTRIBUTES: dict[str, Callable[[dict[str, Any]], None]] = {
    "extent": put("extent", [4096, 96]),
    "extent-float": put("extent", [4096.0, 96]),
    "extent-short": put("extent", [4096]),
    "extent-long": put("extent", [4096, 96, 1]),
    "extent-negative": put("extent", [-1, 96]),
    "extent-bool": put("extent", [True, 96]),
    "attributes": put("attributes", {"units": {"dtype": "|S1", "shape": [], "sha256": SHA}}),
    "attributes-empty": put("attributes", {}),
    "attributes-extra": put(
        "attributes", {"units": {"dtype": "|S1", "shape": [], "sha256": SHA, "x": 1}}
    ),
    "attributes-bad-sha": put("attributes", {"u": {"dtype": "|S1", "shape": [], "sha256": "x"}}),
    "attributes-many": put(
        "attributes", {f"a{i}": {"dtype": "<f8", "shape": [], "sha256": SHA} for i in range(65)}
    ),
    "shape-integral-float": put("shape", [3.0, 4]),
}


@pytest.mark.parametrize("name", sorted({**ALIKE, **EXTENTS_AND_ATTRIBUTES}))
def test_kaudits_direct_check_of_each_dataset_judges_as_the_schema(
    written: dict[str, Any], name: str
) -> None:
    # validate() checks each item of predicate.datasets directly, and leaves any it doubts
    # to jsonschema: it accepts exactly what the schema accepts, with the schema's errors.
    doc = document(written, {**ALIKE, **EXTENTS_AND_ATTRIBUTES}[name])
    errors = sorted(SHIPPED.iter_errors(doc), key=lambda e: list(e.path))
    if not errors:
        validate(doc)
        return
    with pytest.raises(ManifestError) as refused:
        validate(doc)
    where = "/".join(str(p) for p in errors[0].path)
    assert f"schema violation at {where}" in refused.value.message


def in_predicate(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: doc["predicate"].update({key: value})


def in_subject(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: doc["subject"][0].update({key: value})


def in_digest(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: doc["subject"][0]["digest"].update({key: value})


STATEMENTS: dict[str, Callable[[dict[str, Any]], None]] = {
    "as-written": lambda doc: None,
    "run-empty": in_predicate("run", ""),
    "run-number": in_predicate("run", 7),
    "step-negative": in_predicate("step", -1),
    "step-bool": in_predicate("step", True),
    "step-integral-float": in_predicate("step", 3.0),
    "step-string": in_predicate("step", "3"),
    "size-negative": in_predicate("size", -5),
    "parent-null": in_predicate("parent", None),
    "parent-short": in_predicate("parent", "ab"),
    "parent-upper": in_predicate("parent", SHA.upper()),
    "parent-newline": in_predicate("parent", SHA + "\n"),
    "parent-manifest-null": in_predicate("parent_manifest", None),
    "parent-manifest-number": in_predicate("parent_manifest", 5),
    "created-words": in_predicate("created", "yesterday"),
    "created-no-zone": in_predicate("created", "2026-12-06T13:53:17"),
    "created-other-digits": in_predicate("created", "٢٠٢٦-12-06T13:53:17Z"),
    "created-newline": in_predicate("created", "2026-12-06T13:53:17Z\n"),
    "created-month-13": in_predicate("created", "2026-13-06T13:53:17Z"),
    "predicate-extra": in_predicate("bogus", 1),
    "predicate-no-run": lambda doc: doc["predicate"].pop("run"),
    "predicate-no-size": lambda doc: doc["predicate"].pop("size"),
    "statement-type": lambda doc: doc.update(_type="https://in-toto.io/Statement/v0.1"),
    "predicate-type": lambda doc: doc.update(predicateType="x"),
    "statement-extra": lambda doc: doc.update(extra=1),
    "subjects-two": lambda doc: doc["subject"].append(copy.deepcopy(doc["subject"][0])),
    "subjects-none": lambda doc: doc.update(subject=[]),
    "subject-name-empty": in_subject("name", ""),
    "subject-extra": in_subject("extra", 1),
    "subject-sha-short": in_digest("sha256", "ab"),
    "subject-md5-bad": in_digest("md5", "x"),
    "subject-md5-gone": lambda doc: doc["subject"][0]["digest"].pop("md5", None),
    "subject-digest-extra": in_digest("sha512", SHA),
}


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_kaudits_direct_check_of_a_statement_judges_as_the_schema(
    written: dict[str, Any], name: str
) -> None:
    # Once a run's repeated fields validated, validate() checks the rest of a statement
    # like it directly, and leaves any it doubts to jsonschema: it accepts exactly what the
    # schema accepts, with the schema's errors.
    judged_as_the_schema(written, STATEMENTS[name])


def judged_as_the_schema(written: dict[str, Any], edit: Callable[[dict[str, Any]], None]) -> None:
    """``written`` changed by ``edit`` is accepted by validate() exactly when the shipped
    schema accepts it, and refused with the schema's first error's place when not (the
    repeated fields of ``written`` known first, as in a run's later statements)."""
    validate(copy.deepcopy(written))  # the repeated fields, known from now on
    doc = document(written, edit)
    errors = sorted(SHIPPED.iter_errors(doc), key=lambda e: list(e.path))
    if not errors:
        validate(doc)
        return
    with pytest.raises(ManifestError) as refused:
        validate(doc)
    where = "/".join(str(p) for p in errors[0].path) or "(top level)"
    assert f"schema violation at {where}" in refused.value.message


def test_the_statement_kaudit_writes_is_checked_directly(written: dict[str, Any]) -> None:
    from kronos_audit.statement import schemas

    doc = copy.deepcopy(written)
    keys = validate(doc)
    known = frozenset(n for n, k in keys.items() if k in schemas._VALID[n])
    assert "environment" in known
    validator = schemas._validator_without(known, True)
    assert schemas._rest_valid(doc, known, validator)


def campaign(doc: dict[str, Any]) -> None:
    """A campaign's checkpoint: batches run by two workers taking turns, a ledger in
    chunks."""
    ran = [
        {"worker": "node-1:42", "batches": [[0, 0], [2, 2], [4, 5]]},
        {"worker": "node-2:7", "batches": [[1, 1], [3, 3]]},
    ]
    doc["predicate"]["batches"] = {"total": 10, "done": 6, "ran": ran}
    doc["predicate"]["ledger"] = [
        dict(CHUNK),
        {"sha256": "f" * 64, "md5": "1" * 32, "size": 2**31, "first": 4, "count": 2},
    ]


def with_campaign(edit: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        campaign(doc)
        edit(doc)

    return mutate


def in_ran(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return with_campaign(lambda doc: doc["predicate"]["batches"]["ran"][1].update({key: value}))


def in_chunk(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return with_campaign(lambda doc: doc["predicate"]["ledger"][1].update({key: value}))


def ranges(value: Any) -> Callable[[dict[str, Any]], None]:
    return in_ran("batches", value)


def ran_is(value: Any) -> Callable[[dict[str, Any]], None]:
    return with_campaign(lambda doc: doc["predicate"]["batches"].update(ran=value))


def ledger_is(value: Any) -> Callable[[dict[str, Any]], None]:
    return with_campaign(lambda doc: doc["predicate"].update(ledger=value))


CHUNK = {"sha256": SHA, "md5": "0" * 32, "size": 2048, "first": 0, "count": 4}

CAMPAIGN: dict[str, Callable[[dict[str, Any]], None]] = {
    "campaign": campaign,
    "ran-empty": ran_is([]),
    "ran-null": ran_is(None),
    "ran-item-null": ran_is([None]),
    "ran-extra": in_ran("host", "x"),
    "ran-no-worker": with_campaign(lambda doc: doc["predicate"]["batches"]["ran"][0].pop("worker")),
    "worker-empty": in_ran("worker", ""),
    "worker-longest": in_ran("worker", "w" * 256),
    "worker-too-long": in_ran("worker", "w" * 257),
    "worker-wide": in_ran("worker", "é" * 256),
    "worker-number": in_ran("worker", 7),
    "ranges-empty": ranges([]),
    "range-one": ranges([[1]]),
    "range-three": ranges([[1, 2, 3]]),
    "range-negative": ranges([[-1, 2]]),
    "range-float": ranges([[1.0, 2]]),
    "range-bool": ranges([[True, 2]]),
    "range-string": ranges([["1", 2]]),
    "range-not-list": ranges([{"0": 1}]),
    "ranges-not-list": ranges("0-1"),
    "ledger-empty": ledger_is([]),
    "ledger-null": ledger_is(None),
    "ledger-many": ledger_is([CHUNK] * 1025),
    "chunk-extra": in_chunk("name", "x"),
    "chunk-size-zero": in_chunk("size", 0),
    "chunk-size-over": in_chunk("size", 2**31 + 1),
    "chunk-count-zero": in_chunk("count", 0),
    "chunk-first-negative": in_chunk("first", -1),
    "chunk-first-float": in_chunk("first", 4.0),
    "chunk-md5-short": in_chunk("md5", "1" * 31),
    "chunk-md5-upper": in_chunk("md5", "A" * 32),
    "chunk-sha-bad": in_chunk("sha256", "g" * 64),
    "chunk-not-object": ledger_is([SHA]),
}


@pytest.mark.parametrize("name", sorted(CAMPAIGN))
def test_kaudits_direct_check_of_a_campaigns_arrays_judges_as_the_schema(
    written: dict[str, Any], name: str
) -> None:
    # validate() checks each item of batches.ran and of ledger directly (a campaign's
    # checkpoint has thousands of ranges where workers take turns), and leaves an array
    # with any item it doubts to jsonschema: it accepts exactly what the schema accepts.
    judged_as_the_schema(written, CAMPAIGN[name])


def test_a_campaigns_arrays_written_by_kaudit_are_checked_directly(
    written: dict[str, Any],
) -> None:
    from kronos_audit.statement import schemas

    doc = document(written, campaign)
    assert schemas._items_checked(doc) == {"ran", "ledger"}
    assert schemas._items_checked(document(written, in_ran("worker", ""))) == {"ledger"}
    assert schemas._items_checked(document(written, in_chunk("size", 0))) == {"ran"}
