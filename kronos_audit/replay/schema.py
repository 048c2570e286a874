"""Validation against the project's JSON Schemas, with references between them resolved
locally (a replay result refers to the comparison schema; an attestation to the replay
schema): nothing is ever fetched."""

from __future__ import annotations

import functools
from typing import Any

import jsonschema
from referencing import Registry, Resource

from kronos_audit.errors import ManifestError
from kronos_audit.manifest import schema

SCHEMAS = (
    "manifest-v1.schema.json",
    "comparison-v1.schema.json",
    "replay-v1.schema.json",
    "attestation-v1.schema.json",
)


@functools.cache
def _registry() -> Registry[Any]:
    registry: Registry[Any] = Registry()
    for name in SCHEMAS:
        contents = schema(name)
        registry = registry.with_resource(contents["$id"], Resource.from_contents(contents))
    return registry


@functools.cache
def _validator(name: str) -> jsonschema.protocols.Validator:
    s = schema(name)
    cls = jsonschema.validators.validator_for(s)
    cls.check_schema(s)
    validator: jsonschema.protocols.Validator = cls(
        s, registry=_registry(), format_checker=cls.FORMAT_CHECKER
    )
    return validator


def validate(document: Any, schema_name: str, *, what: str = "document") -> None:
    """Raise ManifestError naming the first schema violation (deepest first) and where."""
    errors = sorted(_validator(schema_name).iter_errors(document), key=lambda e: e.path)
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        where = "/".join(str(p) for p in best.absolute_path) or "(top level)"
        raise ManifestError(f"{what}: schema violation at {where}: {best.message}")
