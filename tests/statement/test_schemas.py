"""The JSON Schemas the package ships (kronos_audit/schemas/): each is a valid schema of
the draft it names, and the repository's copy in schemas/ is the same file.

kronos_audit.statement.manifest validates every document against these but no longer checks the
schemas themselves in every process (some 30 ms of each `kaudit verify`): a broken schema
must fail here instead.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kronos_audit.errors import ManifestError
from kronos_audit.statement.schemas import schema, validate

SHIPPED = sorted(
    entry.name
    for entry in resources.files("kronos_audit").joinpath("schemas").iterdir()
    if entry.name.endswith(".schema.json")
)
REPOSITORY_COPY = Path(__file__).resolve().parents[2] / "schemas"


def test_every_schema_named_in_the_package_is_shipped() -> None:
    assert SHIPPED == [
        "attestation-v1.schema.json",
        "campaign-v1.schema.json",
        "campaign-v2.schema.json",
        "campaign-v3.schema.json",
        "comparison-v1.schema.json",
        "manifest-v1.schema.json",
        "replay-v1.schema.json",
        "report-v1.schema.json",
        "revocation-v1.schema.json",
    ]


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_schema_is_valid_against_its_meta_schema(name: str) -> None:
    contents = schema(name)
    assert contents["$schema"] == jsonschema.Draft202012Validator.META_SCHEMA["$id"]
    assert jsonschema.validators.validator_for(contents) is jsonschema.Draft202012Validator
    jsonschema.Draft202012Validator.check_schema(contents)  # a SchemaError says what is wrong


@pytest.mark.parametrize("name", SHIPPED)
def test_the_repository_copy_is_the_shipped_schema(name: str) -> None:
    assert json.loads((REPOSITORY_COPY / name).read_text()) == schema(name)
    assert sorted(p.name for p in REPOSITORY_COPY.glob("*.schema.json")) == SHIPPED


def test_a_broken_schema_is_caught_by_the_meta_schema_check() -> None:
    # What the check above guards against: a schema jsonschema would use without
    # complaint until a document reaches the broken keyword.
    broken: dict[str, Any] = {**schema("manifest-v1.schema.json"), "minProperties": "4"}
    with pytest.raises(jsonschema.SchemaError, match="minProperties"):
        jsonschema.Draft202012Validator.check_schema(broken)


def test_validation_still_refuses_what_the_schema_refuses() -> None:
    # Validation itself is unchanged without the start-up check: strict, one line.
    with pytest.raises(ManifestError, match=r"schema violation at \(top level\)"):
        validate({"_type": "https://in-toto.io/Statement/v1"}, what="a statement")
