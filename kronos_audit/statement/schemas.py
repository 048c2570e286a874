"""The JSON schemas the package ships (``kronos_audit/schemas``), and validating against them.

Every signed statement read or written (manifest, revocation, attestation) and every
document kaudit prints as JSON is checked here. References between the schemas resolve
locally, by ``$id``; nothing is ever fetched.
"""

from __future__ import annotations

import copy
import functools
import json
import re
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


REPEATED = (
    "environment",
    "git",
    "command",
    "cwd",
    "attributes",
    "seeds",
    "rng",
    "writer",
    "scheduler",
    "format",
    "restart_count",
)
"""The predicate's fields that most manifests a process reads share with others (those of
one run, mostly): the environment lock's hundreds of package versions above all."""

_VALID: dict[str, dict[str, None]] = {name: {} for name in REPEATED}
"""For each of those fields, the values (their JSON) that validated in this process."""

_VALID_KEPT = 64
_DATASETS_REF = "#/$defs/predicate/properties/datasets"


_compact = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def _predicate_keys(document: Any) -> dict[str, str]:
    """The JSON of each of the :data:`REPEATED` fields a manifest statement has."""
    try:
        predicate = document["predicate"]
    except (KeyError, TypeError, IndexError):
        return {}
    if not isinstance(predicate, dict):
        return {}
    keys = {}
    for name in REPEATED:
        if name in predicate:
            try:
                keys[name] = _compact(predicate[name])
            except (TypeError, ValueError, RecursionError):
                continue
    return keys


def _moved_refs(node: Any) -> None:
    """Every reference to the predicate's ``datasets`` (a directory step's files have
    theirs) pointed at the copy kept under ``$defs/datasets``, in place."""
    if isinstance(node, dict):
        if node.get("$ref") == _DATASETS_REF:
            node["$ref"] = "#/$defs/datasets"
        for value in node.values():
            _moved_refs(value)
    elif isinstance(node, list):
        for value in node:
            _moved_refs(value)


@functools.lru_cache(maxsize=32)
def _validator_without(
    known: frozenset[str],
    datasets_checked: bool = False,
    items_checked: frozenset[str] = frozenset(),
) -> jsonschema.protocols.Validator:
    """The manifest schema with the subschemas of the predicate's fields ``known`` made
    ``true``: for a statement whose values there validated before; with
    ``datasets_checked``, each item of the predicate's ``datasets`` too, for a statement
    whose items :func:`_datasets_valid` found valid (a directory step's files keep the
    full item schema); and each item of the campaign's arrays named in ``items_checked``
    (``ran``: ``batches.ran``, ``ledger``), which :func:`_items_checked` found valid.
    Nothing in the schema relates one of the predicate's fields to another, so this
    validator finds exactly the errors the full one would."""
    import jsonschema

    s = copy.deepcopy(schema(MANIFEST_SCHEMA))
    suffix = "-known-" + "-".join(sorted(known))
    suffix += "-checked-datasets" if datasets_checked else ""
    suffix += "".join(f"-checked-{name}" for name in sorted(items_checked))
    s["$id"] = s["$id"].removesuffix(".schema.json") + suffix
    properties = s["$defs"]["predicate"]["properties"]
    for name in known:
        properties[name] = True
    if datasets_checked:
        s["$defs"]["datasets"] = properties["datasets"]
        _moved_refs(s)
        properties["datasets"] = {"type": ["array", "null"]}
    if "ran" in items_checked and "batches" not in known:
        properties["batches"]["properties"]["ran"]["items"] = True
    if "ledger" in items_checked and "ledger" not in known:
        properties["ledger"]["items"] = True
    s = _inlined(s, s)
    cls = jsonschema.validators.validator_for(s)
    validator: jsonschema.protocols.Validator = cls(
        s, registry=_registry(), format_checker=cls.FORMAT_CHECKER
    )
    return validator


_ENTRY_KEYS = frozenset({"path", "dtype", "shape", "sha256", "attributes", "extent"})
_ENTRY_REQUIRED = frozenset({"path", "dtype", "shape", "sha256"})
_ATTRIBUTE_KEYS = frozenset({"dtype", "shape", "sha256"})
_HEX = frozenset("0123456789abcdef")
_MAX_ATTRIBUTES = 64


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _digest_valid(entry: dict[str, Any]) -> bool:
    """``dtype``, ``shape`` and ``sha256`` as the schema has them (a dataset's, or one of
    its attributes')."""
    dtype, shape, sha = entry["dtype"], entry["shape"], entry["sha256"]
    return (
        type(dtype) is str
        and len(dtype) > 0
        and (shape is None or (type(shape) is list and all(_count(n) for n in shape)))
        and type(sha) is str
        and len(sha) == 64
        and _HEX.issuperset(sha)
    )


def _entry_valid(entry: Any) -> bool:
    """Whether one item of a manifest's ``datasets`` is certainly valid by the schema.
    Stricter than the schema where that is simpler (exact types: an integral float is an
    integer to jsonschema; no final newline, which the schema's ``$`` lets through): an
    item refused here is judged by jsonschema, so both agree on every item."""
    if type(entry) is not dict:
        return False
    keys = entry.keys()
    if not (_ENTRY_REQUIRED <= keys <= _ENTRY_KEYS):
        return False
    path = entry["path"]
    if type(path) is not str or not path.startswith("/") or not _digest_valid(entry):
        return False
    if "extent" in keys:
        extent = entry["extent"]
        if type(extent) is not list or len(extent) != 2 or not all(_count(n) for n in extent):
            return False
    if "attributes" in keys:
        attributes = entry["attributes"]
        if type(attributes) is not dict or len(attributes) > _MAX_ATTRIBUTES:
            return False
        for value in attributes.values():
            if type(value) is not dict or value.keys() != _ATTRIBUTE_KEYS:
                return False
            if not _digest_valid(value):
                return False
    return True


def _datasets_valid(document: Any) -> bool:
    """Whether the predicate's ``datasets`` is a list whose every item
    :func:`_entry_valid` finds valid: then they need not be checked one by one by
    jsonschema, which costs some 50 microseconds an item (a state of thousands of tensors
    has as many)."""
    try:
        datasets = document["predicate"]["datasets"]
    except (KeyError, TypeError, IndexError):
        return False
    return type(datasets) is list and all(_entry_valid(d) for d in datasets)


_RAN_KEYS = frozenset({"worker", "batches"})
_CHUNK_KEYS = frozenset({"sha256", "md5", "size", "first", "count"})
_WORKER_LIMIT = 256
_CHUNK_LIMIT = 1 << 31


def _ran_valid(ran: Any) -> bool:
    """Whether ``batches.ran`` is a list whose every item (a worker and its ranges of
    batches) is certainly valid by the schema: a campaign's checkpoint has one range for
    each run of batches one worker did in a row, so some thousands where two workers take
    turns, which jsonschema checks at some 10 microseconds a number."""
    if type(ran) is not list:
        return False
    for item in ran:
        if type(item) is not dict or item.keys() != _RAN_KEYS:
            return False
        worker, ranges = item["worker"], item["batches"]
        if type(worker) is not str or not 0 < len(worker) <= _WORKER_LIMIT:
            return False
        if type(ranges) is not list or not ranges:
            return False
        for pair in ranges:
            if type(pair) is not list or len(pair) != 2:
                return False
            first, last = pair
            if type(first) is not int or type(last) is not int or first < 0 or last < 0:
                return False
    return True


def _chunk_valid(chunk: Any) -> bool:
    """Whether one item of the predicate's ``ledger`` is certainly valid by the schema."""
    if type(chunk) is not dict or chunk.keys() != _CHUNK_KEYS:
        return False
    size, first, count, md5 = chunk["size"], chunk["first"], chunk["count"], chunk["md5"]
    return (
        _sha256_valid(chunk["sha256"])
        and type(md5) is str
        and len(md5) == 32
        and _HEX.issuperset(md5)
        and type(size) is int
        and 1 <= size <= _CHUNK_LIMIT
        and type(first) is int
        and first >= 0
        and type(count) is int
        and count >= 1
    )


def _items_checked(document: Any) -> frozenset[str]:
    """Which of a campaign's arrays in a manifest statement's predicate (``ran``:
    ``batches.ran``; ``ledger``) are there, each item certainly valid by the schema:
    jsonschema then checks the arrays, not their items one by one. An array with an item
    these checks doubt is left to jsonschema whole, so both agree on every statement."""
    try:
        predicate = document["predicate"]
        batches = predicate.get("batches") if type(predicate) is dict else None
        ledger = predicate.get("ledger") if type(predicate) is dict else None
    except (KeyError, TypeError, IndexError):
        return frozenset()
    checked = set()
    if type(batches) is dict and "ran" in batches and _ran_valid(batches["ran"]):
        checked.add("ran")
    if type(ledger) is list and all(_chunk_valid(c) for c in ledger):
        checked.add("ledger")
    return frozenset(checked)


_STATEMENT_KEYS = frozenset({"_type", "subject", "predicateType", "predicate"})
_STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
_PREDICATE_TYPE = "https://kronos-audit.dev/checkpoint-manifest/v1"
_CREATED = re.compile(
    r"[0-9]{4}-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9](\.[0-9]+)?Z"
)
_DIRECT = frozenset({"run", "step", "parent", "parent_manifest", "created", "size", "datasets"})
"""The predicate's fields :func:`_rest_valid` checks itself (``datasets`` item by item:
:func:`_datasets_valid`)."""


@functools.cache
def _predicate_required() -> frozenset[str]:
    return frozenset(schema(MANIFEST_SCHEMA)["$defs"]["predicate"]["required"])


def _sha256_valid(value: Any) -> bool:
    return type(value) is str and len(value) == 64 and _HEX.issuperset(value)


def _rest_valid(
    document: Any, known: frozenset[str], validator: jsonschema.protocols.Validator
) -> bool:
    """Whether a manifest statement whose datasets :func:`_datasets_valid` found valid, and
    whose fields ``known`` validated before, is certainly valid by the schema in the rest
    of it too: the statement's frame, its subject, and the fields every manifest has and
    none repeats (its run, step, parent, time and size), checked directly. Stricter than
    the schema where that is simpler (exact types, ASCII digits, no final newline), and it
    takes only the statement kaudit writes: one with any other field, or with anything it
    doubts, is left to jsonschema, so both agree on every statement."""
    if type(document) is not dict or document.keys() != _STATEMENT_KEYS:
        return False
    if document["_type"] != _STATEMENT_TYPE or document["predicateType"] != _PREDICATE_TYPE:
        return False
    subject = document["subject"]
    if type(subject) is not list or len(subject) != 1:
        return False
    (item,) = subject
    if type(item) is not dict or item.keys() != {"name", "digest"}:
        return False
    name, digest = item["name"], item["digest"]
    if type(name) is not str or not name or type(digest) is not dict:
        return False
    md5 = digest.get("md5")
    if not _sha256_valid(digest.get("sha256")) or not digest.keys() <= {"sha256", "md5"}:
        return False
    if md5 is not None and not (type(md5) is str and len(md5) == 32 and _HEX.issuperset(md5)):
        return False
    predicate = document["predicate"]
    if type(predicate) is not dict or not predicate.keys() <= known | _DIRECT:
        return False
    if not _predicate_required() <= predicate.keys():
        return False
    run, step, size = predicate["run"], predicate["step"], predicate["size"]
    parent, parent_manifest = predicate["parent"], predicate["parent_manifest"]
    created = predicate["created"]
    formats = getattr(validator, "format_checker", None)
    return (
        type(run) is str
        and len(run) > 0
        and type(step) is int
        and step >= 0
        and type(size) is int
        and size >= 0
        and (parent is None or _sha256_valid(parent))
        and (parent_manifest is None or type(parent_manifest) is str)
        and type(created) is str
        and _CREATED.fullmatch(created) is not None
        and formats is not None
        and formats.conforms(created, "date-time")
    )


_ANNOTATIONS = frozenset({"$ref", "description", "$comment"})


def _inlined(node: Any, root: dict[str, Any], depth: int = 0) -> Any:
    """``node`` with each reference into ``root`` (``#/...``) that has nothing but
    annotations beside it replaced by what it refers to: the same documents valid, with
    the same errors, without a reference looked up per document (most of the cost of a
    small schema's check). The manifest schema's references do not recurse."""
    if depth > 32:
        raise RecursionError("the schema's references recurse")
    if isinstance(node, list):
        return [_inlined(v, root, depth) for v in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/") and set(node) <= _ANNOTATIONS:
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        inlined = _inlined(target, root, depth + 1)
        if isinstance(inlined, dict):
            inlined = {**inlined, **{k: v for k, v in node.items() if k != "$ref"}}
        return inlined
    return {k: _inlined(v, root, depth) for k, v in node.items()}


def valid_before(name: str, key: str) -> bool:
    """Whether the manifest field ``name`` (one of :data:`REPEATED`) whose JSON is ``key``
    validated in this process (and is still remembered as valid)."""
    return key in _VALID[name]


def validate(
    document: Any,
    path: Path | None = None,
    schema_name: str = MANIFEST_SCHEMA,
    *,
    what: str | None = None,
    keys: dict[str, str] | None = None,
) -> dict[str, str]:
    """Raise ManifestError naming the first schema violation (deepest first) and where;
    ``what`` names the document in the message when there is no path to name.

    A manifest statement's fields that most manifests share (:data:`REPEATED`: the
    environment lock, the git state, the command ...) are checked once per value in this
    process: a statement whose value there is one already found valid is checked against
    the rest of the schema only (the same errors, found without checking the lock's
    hundreds of package versions again); likewise its datasets, once each is found valid
    by a direct check of what the schema says of one (:func:`_entry_valid`; an item it
    doubts is left to the schema), and the items of a campaign's ``batches.ran`` and
    ``ledger`` (:func:`_items_checked`).

    Returns the JSON of each of a valid manifest statement's :data:`REPEATED` fields, by
    name (empty for other documents): what a reader may key a value shared between
    manifests by (:func:`kronos_audit.statement.manifest.parse_manifest` freezes each once).
    ``keys``: that JSON as the reader found it, the very text each field was read from
    (any JSON text of a value names that one value), for a manifest statement; else it is
    worked out here."""
    prefix = f"{what}: " if what else ""
    validator = _validator(schema_name)
    if schema_name != MANIFEST_SCHEMA:
        keys = {}
    elif keys is None:
        keys = _predicate_keys(document)
    known = frozenset(name for name, key in keys.items() if key in _VALID[name])
    datasets_valid = False
    if schema_name == MANIFEST_SCHEMA:
        datasets_valid = _datasets_valid(document)
        validator = _validator_without(known, datasets_valid, _items_checked(document))
    try:
        if datasets_valid and _rest_valid(document, known, validator):
            errors = []
        else:
            errors = sorted(validator.iter_errors(document), key=lambda e: e.path)
    except RecursionError:  # readers refuse deep nesting first (load_json): a backstop
        raise ManifestError(f"{prefix}nested too deeply to check", path=path) from None
    if not errors:
        for name, key in keys.items():
            valid = _VALID[name]
            if key not in valid:
                if len(valid) >= _VALID_KEPT:
                    valid.clear()
                valid[key] = None
    if errors:
        import jsonschema

        best = jsonschema.exceptions.best_match(errors)
        where = "/".join(str(p) for p in best.absolute_path) or "(top level)"
        # jsonschema quotes the offending value whole, which may be megabytes: one line.
        raise ManifestError(
            f"{prefix}schema violation at {clip(where)}: {clip(best.message)}", path=path
        )
    return keys


def clip(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters (ending in ``...`` when cut), for one message line."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
