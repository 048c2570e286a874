"""Manifests: signed in-toto Statements about one checkpoint, in DSSE envelopes.

A manifest lives beside its checkpoint as ``CKPT.kaudit.json``. Its payload is an in-toto
Statement v1 whose single subject is the checkpoint file (sha256) and whose predicate
(``schemas/manifest-v1.schema.json``) records the run, step, parent link, environment
lock, git state, seeds, per-dataset canonical hashes and the command to re-run. Every
manifest read or written is validated against the schema, and its predicate is then
parsed once into a typed record (:class:`kronos_audit.statement.predicate.Predicate`,
``Manifest.record``).

One reader and one writer: :func:`parse_manifest` reads every manifest (from a file,
:func:`read_manifest`), :func:`publish_manifest` writes every one, and the statement
signed is encoded from a typed predicate by :func:`encode_statement`.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kronos_audit._internal import strictjson
from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.collector import deferring_collection
from kronos_audit._internal.frozen import freeze
from kronos_audit._internal.fsutil import write_atomic
from kronos_audit._internal.safeio import MANIFEST_LIMIT, UnsafeFile, read_regular_stat
from kronos_audit.checkpoint.directory import dvc_listing, encode_index, entry_problem, index_root
from kronos_audit.checkpoint.hashing import DatasetDigest
from kronos_audit.checkpoint.layout import STEP_MANIFEST, checkpoint_path_for
from kronos_audit.errors import ManifestError
from kronos_audit.statement.dsse import PAYLOAD_TYPE, Envelope, encode_envelope, parse_envelope
from kronos_audit.statement.predicate import Predicate
from kronos_audit.statement.predicate import Sha256 as Sha256
from kronos_audit.statement.schemas import (
    MANIFEST_SCHEMA,
    REPEATED,
    clip,
    valid_before,
    validate,
)

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://kronos-audit.dev/checkpoint-manifest/v1"
SCHEMA_NAME = MANIFEST_SCHEMA
MAX_DEPTH = strictjson.MAX_DEPTH
"""Deepest nesting of arrays and objects read from a manifest, an attestation or their
payload (kaudit writes under 10; user attributes must fit in the rest)."""
MAX_INT_DIGITS = strictjson.MAX_INT_DIGITS
"""Longest integer read, in digits (Python's default limit, whatever the environment says)."""


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


def encode_statement(
    *, subject_name: str, sha256: str, predicate: Predicate, md5: str | None = None
) -> bytes:
    """The payload a manifest signs: the canonical JSON of the statement
    (:func:`build_statement`) whose predicate is ``predicate``. Raises ValueError or
    TypeError for a value JSON cannot hold (NaN, infinity, an object in the attributes)."""
    statement = build_statement(
        subject_name=subject_name, sha256=sha256, md5=md5, predicate=predicate.to_json_obj()
    )
    return canonical_json(statement)


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
        (:attr:`Manifest.record`, :attr:`kronos_audit.statement.attestation.Attestation.replay`),
        never this by key."""
        p: Mapping[str, Any] = self.statement["predicate"]
        return p


@dataclass(frozen=True)
class Manifest(SignedStatement):
    """A manifest read from disk, its envelope parsed and its statement schema-valid.

    Reading does not check the signature or the data: that is
    :func:`kronos_audit.verification.batch.verify`.
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

    @functools.cached_property
    def checkpoint_path(self) -> Path:
        """The checkpoint beside it (worked out once: a verification asks often)."""
        return checkpoint_path_for(self.path)

    @property
    def run_directory(self) -> Path:
        """The run directory this manifest is in: a checkpoint's manifest is in it, a
        sharded step's (``step-<N>/index.jsonl.kaudit.json``) in its step directory there."""
        if self.record.shards is not None and self.path.name == STEP_MANIFEST:
            return self.path.parent.parent
        return self.path.parent

    @property
    def datasets(self) -> tuple[DatasetDigest, ...] | None:
        return self.record.datasets


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


def parse_signed_envelope(data: bytes, path: Path, what: str = "manifest") -> Envelope:
    """The DSSE envelope of an in-toto Statement from a file's bytes, its payload not yet
    decoded (so that a signature can be checked before the statement is read);
    ManifestError naming ``what`` for anything else."""
    envelope = parse_envelope(load_json(data, path), path)
    if envelope.payload_type != PAYLOAD_TYPE:
        raise ManifestError(
            f"not a {what}: payloadType is {clip(repr(envelope.payload_type))}, "
            f"expected {PAYLOAD_TYPE!r}",
            path=path,
        )
    return envelope


def parse_statement(data: bytes, path: Path, what: str = "manifest") -> tuple[Envelope, Any]:
    """The DSSE envelope and its decoded in-toto Statement (not yet schema-checked) from
    a file's bytes; ManifestError naming ``what`` for anything else."""
    envelope = parse_signed_envelope(data, path, what)
    statement = load_json(envelope.payload, path, "payload")
    return envelope, statement


def read_signed_file(path: Path | str, what: str = "manifest") -> bytes:
    """The bytes of a manifest or attestation file; ManifestError naming ``what`` if none.

    Only a regular file of at most :data:`MANIFEST_LIMIT` bytes is read, and never through
    a symbolic link: a manifest speaks for the checkpoint beside it, so it must be a file
    where it is found, not a pointer to one elsewhere. A FIFO, a device, a directory or a
    socket is refused at once, without blocking.
    """
    return read_signed_file_stat(path, what)[0]


def read_signed_file_stat(path: Path | str, what: str = "manifest") -> tuple[bytes, os.stat_result]:
    """:func:`read_signed_file`, with the ``fstat`` of the file read (see
    :func:`~kronos_audit._internal.safeio.read_regular_stat`)."""
    path = Path(path)
    try:
        return read_regular_stat(path, MANIFEST_LIMIT, follow_symlinks=False)
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


_SHARED: dict[tuple[str, str], Any] = {}
"""The frozen value of each predicate field that manifests share (the environment lock
above all), by the field's name and its JSON: the manifests of a run hold one copy, frozen
once, rather than one each."""
_SHARED_KEPT = 256
_TEXTS: dict[str, list[str]] = {name: [] for name in REPEATED}
"""For each of those fields, the JSON texts it was last read from (newest first) whose
value validated and is in :data:`_SHARED`: a payload that has one of them there is not
read again (:func:`_reused`)."""
_TEXTS_KEPT = 4


def _reused(name: str, text: str, at: int) -> tuple[Any, int] | None:
    """The frozen value of the field ``name`` whose JSON text starts at ``at`` in
    ``text``, and where it ends, when that is a text a manifest read before had there and
    its value is known valid and frozen; else None (it is read)."""
    for known in _TEXTS.get(name, ()):
        if text.startswith(known, at):
            value = _SHARED.get((name, known), _SHARED)
            if value is not _SHARED and valid_before(name, known):
                return value, at + len(known)
    return None


def _statement(payload: bytes, path: Path) -> tuple[Any, dict[str, str] | None]:
    """The statement a manifest's payload holds, as :func:`load_json` reads it, and the
    JSON text of each repeated predicate field as it was read (None: not known), the
    fields a run repeats (:data:`_TEXTS`) not read again."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        read = strictjson.loads_reusing(text, "predicate", _reused, max_depth=MAX_DEPTH)
        if read is not None:
            statement, texts = read
            return statement, {n: t for n, t in texts.items() if n in _TEXTS}
    return load_json(payload, path, "payload"), None


def _remember_texts(keys: Mapping[str, str]) -> None:
    """Each field's text in ``keys`` (a valid statement's, its values in :data:`_SHARED`)
    first among :data:`_TEXTS`."""
    for name, key in keys.items():
        texts = _TEXTS.get(name)
        if texts is None or (texts and texts[0] == key):
            continue
        if key in texts:
            texts.remove(key)
        texts.insert(0, key)
        del texts[_TEXTS_KEPT:]


def _frozen(statement: Any, shared: Mapping[str, str]) -> Any:
    """:func:`~kronos_audit._internal.frozen.freeze` of a valid statement, the predicate's
    fields named in ``shared`` (name -> their JSON, as validation gave them) taken from,
    or added to, :data:`_SHARED`: equal JSON, equal value."""
    if not shared:
        return freeze(statement)
    predicate = statement["predicate"]
    fields = {}
    for name, value in predicate.items():
        key = shared.get(name)
        if key is None:
            fields[name] = freeze(value)
            continue
        known = _SHARED.get((name, key))
        if known is None:
            if len(_SHARED) >= _SHARED_KEPT:
                _SHARED.clear()
            known = _SHARED[(name, key)] = freeze(value)
        fields[name] = known
    return MappingProxyType(
        {
            k: MappingProxyType(fields) if k == "predicate" else freeze(v)
            for k, v in statement.items()
        }
    )


@deferring_collection
def parse_manifest(data: bytes, path: Path) -> Manifest:
    """Parse manifest bytes; raise ManifestError for anything that is not a valid manifest."""
    envelope = parse_signed_envelope(data, path)
    statement, texts = _statement(envelope.payload, path)
    keys = validate(statement, path, keys=texts)
    frozen = _frozen(statement, keys)
    _remember_texts(keys)
    manifest = Manifest(
        path=path,
        envelope=envelope,
        statement=frozen,
        digest=Sha256(hashlib.sha256(data).hexdigest()),
        record=Predicate.from_json_obj(frozen["predicate"]),
    )
    if manifest.record.directory is not None:
        problem = directory_problem(manifest)
        if problem is not None:
            raise ManifestError(f"directory step: {problem}", path=path)
    return manifest


def directory_problem(manifest: Manifest) -> str | None:
    """What makes a directory step's record disagree with itself, or None: a file's path
    that leaves the directory or comes twice or out of order, a count, byte total or
    Merkle root that is not its files', a subject that is not their index. Checked when
    read, so every reader may take the files as a consistent listing (their bytes are
    another matter: verify hashes them)."""
    record = manifest.record
    d = record.directory
    assert d is not None
    previous = None
    for entry in d.files:
        problem = entry_problem(entry)
        if problem is not None:
            return problem
        if previous is not None and entry.path <= previous:
            return f"{clip(entry.path)!r} is out of path order or listed twice"
        previous = entry.path
    if d.count != len(d.files) or d.bytes != sum(f.size for f in d.files):
        return "its file count or byte total is not its files'"
    if record.size != d.bytes or record.shards is not None:
        return "its size is not its files' total, or it is also a sharded step"
    if hashlib.sha256(encode_index(d.files)).hexdigest() != manifest.subject_sha256:
        return "its subject's sha256 is not its file index's"
    if index_root(d.files) != d.root:
        return "its Merkle root is not its file index's"
    md5 = hashlib.md5(dvc_listing(d.files), usedforsecurity=False).hexdigest()
    if manifest.subject_md5 not in (None, md5):
        return "its subject's md5 is not its DVC listing's"
    return None


def read_manifest(path: Path | str) -> Manifest:
    return parse_manifest(read_signed_file(path), Path(path))


def write_manifest(path: Path, envelope: Envelope) -> Manifest:
    """Check as every reader checks, then write atomically; return the manifest as a reader
    will see it."""
    return publish_manifest(parse_manifest(encode_envelope(envelope), path))


def publish_manifest(manifest: Manifest) -> Manifest:
    """Write a manifest already parsed (so checked) atomically: the one writer of
    manifests, whose bytes are the ones its digest is of."""
    try:
        write_atomic(manifest.path, encode_envelope(manifest.envelope))
    except OSError as e:
        raise ManifestError(
            f"cannot write manifest: {e.strerror or e}", path=manifest.path
        ) from None
    return manifest
