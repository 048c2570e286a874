"""The JSON schemas the package ships (``kronos_audit/schemas``), and validating against them.

Every signed statement read or written (manifest, revocation, attestation) and every
document kaudit prints as JSON is checked here. References between the schemas resolve
locally, by ``$id``; nothing is ever fetched.
"""

from __future__ import annotations

import copy
import functools
import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kronos_audit.errors import ManifestError

# jsonschema and referencing (some 90 ms of CPU to import) are imported by the first
# validation: a process that reads or writes no statement (an MPI rank other than 0 of a
# fresh run, `kaudit --help`) does not pay for them.
if TYPE_CHECKING:
    import jsonschema
    from referencing import Registry

MANIFEST_SCHEMA = "manifest-v1.schema.json"
"""A manifest's statement: the schema :func:`schema` and :func:`validate` take by default."""


@functools.cache
def schema(name: str = MANIFEST_SCHEMA) -> dict[str, Any]:
    text = resources.files("kronos_audit").joinpath("schemas", name).read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@functools.cache
def _registry() -> Registry[Any]:
    """Every schema the project ships, by its $id: references between them (a replay result
    refers to the comparison schema) resolve locally, and nothing is ever fetched."""
    from referencing import Registry, Resource

    registry: Registry[Any] = Registry()
    for entry in resources.files("kronos_audit").joinpath("schemas").iterdir():
        if entry.name.endswith(".schema.json"):
            contents = schema(entry.name)
            registry = registry.with_resource(contents["$id"], Resource.from_contents(contents))
    return registry


@functools.cache
def _validator(name: str) -> jsonschema.protocols.Validator:
    # The shipped schemas are checked against their meta-schema by the tests
    # (tests/statement/test_schemas.py), not here: that check is of the package, not of the
    # document, and cost every process that reads a manifest some 30 ms.
    import jsonschema

    s = schema(name)
    cls = jsonschema.validators.validator_for(s)
    validator: jsonschema.protocols.Validator = cls(
        s, registry=_registry(), format_checker=cls.FORMAT_CHECKER
    )
    return validator


_VALID_ENVIRONMENTS: dict[str, None] = {}
"""The environment locks (their canonical JSON) of manifests that validated in this process:
a run's manifests, and most manifests a process reads, carry the same lock, and checking
its package list is most of the cost of checking a manifest."""

_VALID_ENVIRONMENTS_KEPT = 64


def _environment_key(document: Any) -> str | None:
    """The canonical JSON of a manifest statement's environment lock, if it has one."""
    try:
        environment = document["predicate"]["environment"]
    except (KeyError, TypeError, IndexError):
        return None
    if not isinstance(environment, dict):
        return None
    try:
        return json.dumps(environment, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None


@functools.cache
def _validator_for_a_valid_environment() -> jsonschema.protocols.Validator:
    """The manifest schema with the environment lock's subschema ``true``: for a statement
    whose lock is one that validated before. Nothing in the schema relates the lock to
    another field, so this validator finds exactly the errors the full one would."""
    import jsonschema

    s = copy.deepcopy(schema(MANIFEST_SCHEMA))
    s["$id"] = s["$id"].removesuffix(".schema.json") + "-known-environment.schema.json"
    s["$defs"]["predicate"]["properties"]["environment"] = True
    cls = jsonschema.validators.validator_for(s)
    validator: jsonschema.protocols.Validator = cls(
        s, registry=_registry(), format_checker=cls.FORMAT_CHECKER
    )
    return validator


def validate(
    document: Any,
    path: Path | None = None,
    schema_name: str = MANIFEST_SCHEMA,
    *,
    what: str | None = None,
) -> None:
    """Raise ManifestError naming the first schema violation (deepest first) and where;
    ``what`` names the document in the message when there is no path to name.

    A manifest statement whose environment lock is one already found valid in this
    process is checked against the rest of the schema only (the same errors, found
    without checking the lock's hundreds of package versions again)."""
    prefix = f"{what}: " if what else ""
    validator = _validator(schema_name)
    environment = _environment_key(document) if schema_name == MANIFEST_SCHEMA else None
    if environment is not None and environment in _VALID_ENVIRONMENTS:
        validator = _validator_for_a_valid_environment()
    try:
        errors = sorted(validator.iter_errors(document), key=lambda e: e.path)
    except RecursionError:  # readers refuse deep nesting first (load_json): a backstop
        raise ManifestError(f"{prefix}nested too deeply to check", path=path) from None
    if not errors and environment is not None:
        if len(_VALID_ENVIRONMENTS) >= _VALID_ENVIRONMENTS_KEPT:
            _VALID_ENVIRONMENTS.clear()
        _VALID_ENVIRONMENTS[environment] = None
    if errors:
        import jsonschema

        best = jsonschema.exceptions.best_match(errors)
        where = "/".join(str(p) for p in best.absolute_path) or "(top level)"
        # jsonschema quotes the offending value whole, which may be megabytes: one line.
        raise ManifestError(
            f"{prefix}schema violation at {clip(where)}: {clip(best.message)}", path=path
        )


def clip(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters (ending in ``...`` when cut), for one message line."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
