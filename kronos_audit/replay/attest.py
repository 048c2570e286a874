"""Replay attestations: a signed statement that a segment was replayed, and how it came out.

An attestation is a DSSE envelope, signed like a manifest, whose payload is an in-toto
Statement v1 (``schemas/attestation-v1.schema.json``):

- ``subject``: the manifest replayed (its file's sha256) and the recorded checkpoint it
  signs (that file's sha256), each named relative to the repository root;
- ``predicateType``: :data:`PREDICATE_TYPE`;
- ``predicate``: the replay result (``schemas/replay-v1.schema.json``): which manifest and
  parent, the code, the command, this machine's environment lock digest and its drift,
  the tolerance policy, the per-dataset verdicts, the outcome and the timings.

It is written beside the manifest as ``CKPT.replay.json`` (see
:func:`kronos_audit.checkpoint.layout.attestation_path_for`)
and verifies with the repository's trust store like any manifest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.fsutil import write_atomic
from kronos_audit.errors import ManifestError
from kronos_audit.keys.keyfile import Envelope, SigningKey, sign_envelope
from kronos_audit.replay.interface import ManifestRef, Outcome, ReplayResult
from kronos_audit.statement.manifest import (
    STATEMENT_TYPE,
    Sha256,
    SignedStatement,
    encode_envelope,
    parse_statement,
    read_signed_file,
    validate,
)

PREDICATE_TYPE = "https://kronos-audit.dev/replay/v1"
SCHEMA_NAME = "attestation-v1.schema.json"


def build_statement(result: ReplayResult) -> dict[str, Any]:
    """The in-toto Statement an attestation of ``result`` signs."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": result.manifest.path, "digest": {"sha256": result.manifest.sha256}},
            {
                "name": result.manifest.checkpoint,
                "digest": {"sha256": result.manifest.checkpoint_sha256},
            },
        ],
        "predicateType": PREDICATE_TYPE,
        "predicate": result.to_json_obj(),
    }


@dataclass(frozen=True)
class AttestedReplay:
    """What an attestation's predicate (a replay result) says, typed: the parts read back.
    The rest (drift, policy, per-dataset verdicts, timings) stays in
    :attr:`Attestation.predicate`, the document as signed."""

    manifest: ManifestRef
    """The manifest replayed."""
    parent: ManifestRef | None
    """The manifest the replay resumed from; None: replayed from the start."""
    parent_fetched: bool
    """The parent checkpoint was fetched from the DVC remote for the replay."""
    outcome: Outcome
    """The verdict over all datasets."""
    commit: str
    """The commit the code was materialised at."""
    patch_sha256: Sha256 | None
    """The recorded patch re-applied, if any."""
    replayed_at: str
    """RFC 3339 UTC time the replay finished: the time its signature is judged at."""
    tool: str
    """``kronos-audit X.Y.Z``: what replayed it."""

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> AttestedReplay:
        """The record of a schema-valid replay result (``schemas/replay-v1.schema.json``)."""
        parent = obj["parent"]
        code = obj["code"]
        patch = code["patch_sha256"]
        return cls(
            manifest=ManifestRef.from_json_obj(obj["manifest"]),
            parent=None if parent is None else ManifestRef.from_json_obj(parent),
            parent_fetched=parent is not None and bool(parent["fetched"]),
            outcome=Outcome(obj["outcome"]),
            commit=str(code["commit"]),
            patch_sha256=None if patch is None else Sha256(str(patch)),
            replayed_at=str(obj["replayed_at"]),
            tool=str(obj["tool"]),
        )


@dataclass(frozen=True)
class Attestation(SignedStatement):
    """An attestation read from or written to disk, its statement schema-valid."""

    replay: AttestedReplay
    """The predicate, typed (what is read back of it): parsed once, when it was read."""

    @property
    def outcome(self) -> Outcome:
        return self.replay.outcome

    @property
    def manifest_sha256(self) -> Sha256:
        """The first subject: the sha256 of the manifest it attests."""
        return Sha256(str(self.statement["subject"][0]["digest"]["sha256"]))

    @property
    def checkpoint_sha256(self) -> Sha256:
        """The second subject: the sha256 of the checkpoint that manifest signs."""
        return Sha256(str(self.statement["subject"][1]["digest"]["sha256"]))


def _attestation(path: Path, envelope: Envelope, statement: Any) -> Attestation:
    return Attestation(
        path, envelope, statement, AttestedReplay.from_json_obj(statement["predicate"])
    )


def write_attestation(result: ReplayResult, key: SigningKey, path: Path) -> Attestation:
    """Sign ``result`` with ``key`` and write the attestation atomically to ``path``."""
    statement = build_statement(result)
    validate(statement, schema_name=SCHEMA_NAME, what="attestation")
    envelope = sign_envelope(canonical_json(statement), key)
    try:
        write_atomic(path, encode_envelope(envelope))
    except OSError as e:
        raise ManifestError(f"cannot write the attestation: {e.strerror or e}", path=path) from None
    return _attestation(path, envelope, statement)


def read_attestation(path: Path | str) -> Attestation:
    """Read and schema-check an attestation. Its signature, its binding to the manifest
    beside it and the signer's anchors and revocations are checked by
    :meth:`kronos_audit.verification.verify.Verifier.verify_attestation` (``kaudit verify``):
    there is no second, partial way."""
    path = Path(path)
    envelope, statement = parse_statement(
        read_signed_file(path, "attestation"), path, "attestation"
    )
    validate(statement, path, schema_name=SCHEMA_NAME, what="attestation")
    return _attestation(path, envelope, statement)
