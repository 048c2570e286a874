"""Replay attestations: a signed statement that a segment was replayed, and how it came out.

An attestation is a DSSE envelope, signed like a manifest, whose payload is an in-toto
Statement v1 (``schemas/attestation-v1.schema.json``):

- ``subject``: the manifest replayed (its file's sha256) and the recorded checkpoint it
  signs (that file's sha256), each named relative to the repository root;
- ``predicateType``: :data:`PREDICATE_TYPE`;
- ``predicate``: the replay result (``schemas/replay-v1.schema.json``): which manifest and
  parent, the code, the command, this machine's environment lock digest and its drift,
  the tolerance policy, the per-dataset verdicts, the outcome and the timings.

It is written beside the manifest as ``CKPT.replay.json`` (see :func:`attestation_path_for`)
and verifies with the repository's trust store like any manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.fsutil import write_atomic
from kronos_audit.errors import ManifestError
from kronos_audit.manifest import (
    STATEMENT_TYPE,
    SignedStatement,
    checkpoint_path_for,
    encode_envelope,
    parse_statement,
    read_signed_file,
    validate,
)
from kronos_audit.replay.interface import ReplayResult
from kronos_audit.signing import (
    SignatureCheck,
    SigningKey,
    TrustStore,
    sign_envelope,
    verify_envelope,
)

PREDICATE_TYPE = "https://kronos-audit.dev/replay/v1"
ATTESTATION_SUFFIX = ".replay.json"
SCHEMA_NAME = "attestation-v1.schema.json"


def attestation_path_for(manifest: Path) -> Path:
    """``CKPT.replay.json`` beside the manifest ``CKPT.kaudit.json``."""
    checkpoint = checkpoint_path_for(manifest)
    return checkpoint.with_name(checkpoint.name + ATTESTATION_SUFFIX)


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
class Attestation(SignedStatement):
    """An attestation read from or written to disk, its statement schema-valid."""

    @property
    def outcome(self) -> str:
        return str(self.predicate["outcome"])

    def verify(self, trust: TrustStore) -> SignatureCheck:
        """Whether a key ``trust`` holds signed it."""
        return verify_envelope(self.envelope, trust)


def write_attestation(result: ReplayResult, key: SigningKey, path: Path) -> Attestation:
    """Sign ``result`` with ``key`` and write the attestation atomically to ``path``."""
    statement = build_statement(result)
    validate(statement, schema_name=SCHEMA_NAME, what="attestation")
    envelope = sign_envelope(canonical_json(statement), key)
    try:
        write_atomic(path, encode_envelope(envelope))
    except OSError as e:
        raise ManifestError(f"cannot write the attestation: {e.strerror or e}", path=path) from None
    return Attestation(path, envelope, statement)


def read_attestation(path: Path | str) -> Attestation:
    """Read and schema-check an attestation (its signature is :meth:`Attestation.verify`)."""
    path = Path(path)
    envelope, statement = parse_statement(
        read_signed_file(path, "attestation"), path, "attestation"
    )
    validate(statement, path, schema_name=SCHEMA_NAME, what="attestation")
    return Attestation(path, envelope, statement)
