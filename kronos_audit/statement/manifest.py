"""Manifests: signed in-toto Statements about one checkpoint, in DSSE envelopes.

A manifest lives beside its checkpoint as ``CKPT.kaudit.json``. Its payload is an in-toto
Statement v1 whose single subject is the checkpoint file (sha256) and whose predicate
(``schemas/manifest-v1.schema.json``) records the run, step, parent link, environment
lock, git state, seeds, per-dataset canonical hashes and the command to re-run. Every
manifest read or written is validated against the schema, and its predicate is then
parsed once into a typed record (:class:`kronos_audit.statement.predicate.Predicate`,
``Manifest.record``).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jsonschema
from referencing import Registry, Resource

from kronos_audit._internal import strictjson
from kronos_audit._internal.fsutil import write_atomic
from kronos_audit._internal.safeio import MANIFEST_LIMIT, UnsafeFile, read_regular
from kronos_audit.checkpoint.hashing import DatasetDigest
from kronos_audit.errors import ManifestError
from kronos_audit.keys.keyfile import PAYLOAD_TYPE, Envelope, parse_envelope
from kronos_audit.statement.predicate import Predicate
from kronos_audit.statement.predicate import Sha256 as Sha256

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://kronos-audit.dev/checkpoint-manifest/v1"
MANIFEST_SUFFIX = ".kaudit.json"
SCHEMA_NAME = "manifest-v1.schema.json"
MAX_DEPTH = strictjson.MAX_DEPTH
"""Deepest nesting of arrays and objects read from a manifest, an attestation or their
payload (kaudit writes under 10; user attributes must fit in the rest)."""
MAX_INT_DIGITS = strictjson.MAX_INT_DIGITS
"""Longest integer read, in digits (Python's default limit, whatever the environment says)."""


def manifest_path_for(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name + MANIFEST_SUFFIX)


def checkpoint_path_for(manifest: Path) -> Path:
    if not manifest.name.endswith(MANIFEST_SUFFIX) or manifest.name == MANIFEST_SUFFIX:
        raise ManifestError(f"a manifest's name ends in {MANIFEST_SUFFIX}", path=manifest)
    return manifest.with_name(manifest.name[: -len(MANIFEST_SUFFIX)])


@functools.cache
def schema(name: str = SCHEMA_NAME) -> dict[str, Any]:
    text = resources.files("kronos_audit").joinpath("schemas", name).read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@functools.cache
def _registry() -> Registry[Any]:
    """Every schema the project ships, by its $id: references between them (a replay result
    refers to the comparison schema) resolve locally, and nothing is ever fetched."""
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
    s = schema(name)
    cls = jsonschema.validators.validator_for(s)
    validator: jsonschema.protocols.Validator = cls(
        s, registry=_registry(), format_checker=cls.FORMAT_CHECKER
    )
    return validator


def validate(
    document: Any,
    path: Path | None = None,
    schema_name: str = SCHEMA_NAME,
    *,
    what: str | None = None,
) -> None:
    """Raise ManifestError naming the first schema violation (deepest first) and where;
    ``what`` names the document in the message when there is no path to name."""
    prefix = f"{what}: " if what else ""
    try:
        errors = sorted(_validator(schema_name).iter_errors(document), key=lambda e: e.path)
    except RecursionError:  # readers refuse deep nesting first (load_json): a backstop
        raise ManifestError(f"{prefix}nested too deeply to check", path=path) from None
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        where = "/".join(str(p) for p in best.absolute_path) or "(top level)"
        # jsonschema quotes the offending value whole, which may be megabytes: one line.
        raise ManifestError(
            f"{prefix}schema violation at {_clip(where)}: {_clip(best.message)}", path=path
        )


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def build_statement(
    *,
    subject_name: str,
    sha256: str,
    predicate: Mapping[str, Any],
    md5: str | None = None,
) -> dict[str, Any]:
    """An in-toto Statement about one checkpoint file. sha256 is the security anchor; md5,
    when given, is DVC's storage address for the same bytes."""
    digest = {"sha256": sha256} if md5 is None else {"sha256": sha256, "md5": md5}
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject_name, "digest": digest}],
        "predicateType": PREDICATE_TYPE,
        "predicate": dict(predicate),
    }


def encode_envelope(envelope: Envelope) -> bytes:
    return (json.dumps(envelope.to_json_obj(), indent=2, sort_keys=True) + "\n").encode()


@dataclass(frozen=True)
class SignedStatement:
    """A DSSE envelope read from disk, with its decoded in-toto Statement."""

    path: Path
    """Where it was read from."""
    envelope: Envelope
    """The DSSE envelope."""
    statement: Mapping[str, Any]
    """The decoded in-toto Statement (read-only)."""

    @property
    def predicate(self) -> Mapping[str, Any]:
        """The statement's predicate as signed: read-only JSON values, for whoever wants
        the document itself (``kaudit show --json``). The package reads the typed record
        (:attr:`Manifest.record`, :attr:`kronos_audit.replay.attest.Attestation.replay`),
        never this by key."""
        p: Mapping[str, Any] = self.statement["predicate"]
        return p


@dataclass(frozen=True)
class Manifest(SignedStatement):
    """A manifest read from disk, its envelope parsed and its statement schema-valid.

    Reading does not check the signature or the data: that is
    :func:`kronos_audit.verification.verify.verify`.
    """

    digest: Sha256
    """sha256 of the manifest file's bytes: what a child's ``parent`` names."""
    record: Predicate
    """The predicate, typed: parsed once, when the manifest was read."""

    @property
    def run(self) -> str:
        return self.record.run

    @property
    def step(self) -> int:
        return self.record.step

    @property
    def parent(self) -> Sha256 | None:
        return self.record.parent

    @property
    def subject_name(self) -> str:
        return str(self.statement["subject"][0]["name"])

    @property
    def subject_sha256(self) -> Sha256:
        return Sha256(self.statement["subject"][0]["digest"]["sha256"])

    @property
    def subject_md5(self) -> str | None:
        """DVC's address for the checkpoint's bytes, when it is tracked by DVC."""
        md5 = self.statement["subject"][0]["digest"].get("md5")
        return None if md5 is None else str(md5)

    @property
    def checkpoint_path(self) -> Path:
        return checkpoint_path_for(self.path)

    @property
    def datasets(self) -> tuple[DatasetDigest, ...] | None:
        return self.record.datasets


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def load_json(data: bytes, path: Path, where: str = "") -> Any:
    """JSON from bytes nobody has vouched for yet, or ManifestError saying why not.

    Stricter than :func:`json.loads`, so that what is read cannot hang, exhaust the stack
    or mean two things: duplicate keys, NaN and Infinity, integers of more than
    :data:`MAX_INT_DIGITS` digits and nesting deeper than :data:`MAX_DEPTH` are refused
    (:mod:`kronos_audit._internal.strictjson`). ``where`` (such as ``"payload"``)
    prefixes the message.
    """
    at = f"{where}: " if where else ""
    try:
        # UTF-8 only (RFC 8259, DSSE): json.loads would guess UTF-16 or UTF-32 from bytes.
        return strictjson.loads(data.decode("utf-8"), max_depth=MAX_DEPTH)
    except UnicodeDecodeError:
        raise ManifestError(f"{at}not UTF-8 text", path=path) from None
    except strictjson.Refused as e:
        raise ManifestError(f"{at}{e}", path=path) from None


def parse_statement(data: bytes, path: Path, what: str = "manifest") -> tuple[Envelope, Any]:
    """The DSSE envelope and its decoded in-toto Statement (not yet schema-checked) from
    a file's bytes; ManifestError naming ``what`` for anything else."""
    envelope = parse_envelope(load_json(data, path), path)
    if envelope.payload_type != PAYLOAD_TYPE:
        raise ManifestError(
            f"not a {what}: payloadType is {_clip(repr(envelope.payload_type))}, "
            f"expected {PAYLOAD_TYPE!r}",
            path=path,
        )
    statement = load_json(envelope.payload, path, "payload")
    return envelope, statement


def read_signed_file(path: Path | str, what: str = "manifest") -> bytes:
    """The bytes of a manifest or attestation file; ManifestError naming ``what`` if none.

    Only a regular file of at most :data:`MANIFEST_LIMIT` bytes is read, and never through
    a symbolic link: a manifest speaks for the checkpoint beside it, so it must be a file
    where it is found, not a pointer to one elsewhere. A FIFO, a device, a directory or a
    socket is refused at once, without blocking.
    """
    path = Path(path)
    try:
        return read_regular(path, MANIFEST_LIMIT, follow_symlinks=False)
    except UnsafeFile as e:
        if e.missing:
            raise ManifestError(f"{what} not found", path=path) from None
        if e.reason.startswith("cannot read it"):
            raise ManifestError(
                f"cannot read {what}{e.reason.removeprefix('cannot read it')}", path=path
            ) from None
        if e.reason == "is a symbolic link":
            raise ManifestError(
                f"{what} is a symbolic link: refused, it must be a file where it is found",
                path=path,
            ) from None
        raise ManifestError(f"{what} {e.reason}", path=path) from None


def parse_manifest(data: bytes, path: Path) -> Manifest:
    """Parse manifest bytes; raise ManifestError for anything that is not a valid manifest."""
    envelope, statement = parse_statement(data, path)
    validate(statement, path)
    frozen = _freeze(statement)
    return Manifest(
        path=path,
        envelope=envelope,
        statement=frozen,
        digest=Sha256(hashlib.sha256(data).hexdigest()),
        record=Predicate.from_json_obj(frozen["predicate"]),
    )


def read_manifest(path: Path | str) -> Manifest:
    return parse_manifest(read_signed_file(path), Path(path))


def write_manifest(path: Path, envelope: Envelope) -> Manifest:
    """Validate and write atomically; return the manifest as a reader will see it."""
    data = encode_envelope(envelope)
    manifest = parse_manifest(data, path)  # the same checks every reader makes
    try:
        write_atomic(path, data)
    except OSError as e:
        raise ManifestError(f"cannot write manifest: {e.strerror or e}", path=path) from None
    return manifest
