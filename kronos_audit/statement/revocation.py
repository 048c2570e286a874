"""Revocations, the format: a DSSE-signed statement that a key is no longer to be trusted
from a time on (``schemas/revocation-v1.schema.json``).

Its payload type is :data:`REVOCATION_PAYLOAD_TYPE` (never a manifest's, so neither can
pass for the other) and its statement ``{"_type", "key_id", "revoked_at", "reason"}``.
Which revocations count, and where they are kept, is :mod:`kronos_audit.keys.revocation`.
"""

from __future__ import annotations

from typing import Any

from kronos_audit._internal import strictjson
from kronos_audit._internal.canonical import canonical_json
from kronos_audit.errors import ManifestError
from kronos_audit.statement.dsse import (
    Envelope,
    EnvelopeSigner,
    KeyId,
    encode_envelope,
    parse_envelope,
    sign_envelope,
)
from kronos_audit.statement.schemas import validate

REVOCATION_PAYLOAD_TYPE = "application/vnd.kronos-audit.revocation+json"
REVOCATION_TYPE = "https://kronos-audit.dev/revocation/v1"
REVOCATION_SCHEMA = "revocation-v1.schema.json"


def revocation_statement(key: KeyId, reason: str, revoked_at: str) -> dict[str, Any]:
    return {"_type": REVOCATION_TYPE, "key_id": key, "revoked_at": revoked_at, "reason": reason}


def encode_revocation(key: KeyId, reason: str, revoked_at: str, signer: EnvelopeSigner) -> bytes:
    """The bytes of a revocation of ``key`` signed by ``signer``, schema-checked first."""
    statement = revocation_statement(key, reason, revoked_at)
    validate(statement, None, REVOCATION_SCHEMA, what="revocation")
    envelope = sign_envelope(canonical_json(statement), signer, REVOCATION_PAYLOAD_TYPE)
    return encode_envelope(envelope)


def parse_revocation(data: bytes, where: str) -> tuple[Envelope, dict[str, Any]]:
    """The envelope and the schema-valid statement of a revocation file's bytes read at
    ``where``; ManifestError for anything that is not one."""
    try:
        # read as strictly as a manifest: a revocation must mean one thing to everyone
        envelope = parse_envelope(strictjson.loads(data.decode("utf-8")))
        if envelope.payload_type != REVOCATION_PAYLOAD_TYPE:
            raise ManifestError(f"payloadType is not {REVOCATION_PAYLOAD_TYPE}")
        statement = strictjson.loads(envelope.payload.decode("utf-8"))
    except (ValueError, RecursionError, ManifestError) as e:
        raise ManifestError(f"not a revocation: {getattr(e, 'message', e)}", path=where) from None
    validate(statement, None, REVOCATION_SCHEMA, what=f"{where}: revocation")
    return envelope, statement
