"""DSSE envelopes (https://github.com/secure-systems-lab/dsse): the signed wrapper of every
statement kaudit writes.

The signature is over the pre-authentication encoding PAE(payloadType, payload), so it
covers the payload type too. A key is named by its key id, the hex sha256 of the raw
32-byte Ed25519 public key. This is the format an outside verifier reads; where keys come
from and which are trusted is :mod:`kronos_audit.keys`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NewType, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kronos_audit.errors import ManifestError

KeyId = NewType("KeyId", str)
"""Hex sha256 of a raw 32-byte Ed25519 public key."""

PAYLOAD_TYPE = "application/vnd.in-toto+json"


class EnvelopeSigner(Protocol):
    """What signs an envelope: a key id to name it by, and the signing itself
    (:class:`kronos_audit.keys.keyfile.SigningKey` is one)."""

    @property
    def key_id(self) -> KeyId: ...

    def sign(self, message: bytes) -> bytes: ...


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding of ``payload`` with its type."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def key_id(public_key: Ed25519PublicKey) -> KeyId:
    """The key id of ``public_key``: hex sha256 of its raw bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return KeyId(hashlib.sha256(raw).hexdigest())


@dataclass(frozen=True)
class Signature:
    """One DSSE signature."""

    keyid: str
    """Key id the signer claims; may be empty per DSSE."""
    sig: bytes
    """Raw Ed25519 signature."""


@dataclass(frozen=True)
class Envelope:
    """A parsed DSSE envelope."""

    payload_type: str
    """``payloadType``."""
    payload: bytes
    """Decoded payload."""
    signatures: tuple[Signature, ...]
    """Signatures over PAE(payload_type, payload)."""

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "payloadType": self.payload_type,
            "payload": base64.b64encode(self.payload).decode(),
            "signatures": [
                {"keyid": s.keyid, "sig": base64.b64encode(s.sig).decode()} for s in self.signatures
            ],
        }


def encode_envelope(envelope: Envelope) -> bytes:
    """The envelope as a file holds it: JSON, keys sorted, indented, one final newline."""
    return (json.dumps(envelope.to_json_obj(), indent=2, sort_keys=True) + "\n").encode()


def sign_envelope(
    payload: bytes, key: EnvelopeSigner, payload_type: str = PAYLOAD_TYPE
) -> Envelope:
    """Sign ``payload`` with ``key`` into a one-signature envelope."""
    return Envelope(
        payload_type, payload, (Signature(key.key_id, key.sign(pae(payload_type, payload))),)
    )


def _b64decode(text: object, what: str, path: Path | None) -> bytes:
    if not isinstance(text, str):
        raise ManifestError(f"not a DSSE envelope: {what} is not a string", path=path)
    # DSSE accepts standard and URL-safe base64 alike.
    alphabet = b"-_" if ("-" in text or "_" in text) else None
    try:
        return base64.b64decode(text, altchars=alphabet, validate=True)
    except (binascii.Error, ValueError):
        raise ManifestError(f"not a DSSE envelope: {what} is not base64", path=path) from None


def parse_envelope(obj: object, path: Path | None = None) -> Envelope:
    """Check the DSSE structure of a decoded JSON value; raise ManifestError if it is not one."""
    if not isinstance(obj, Mapping):
        raise ManifestError("not a DSSE envelope: top level is not an object", path=path)
    for field in ("payloadType", "payload", "signatures"):
        if field not in obj:
            raise ManifestError(f"not a DSSE envelope: no {field!r} field", path=path)
    payload_type = obj["payloadType"]
    if not isinstance(payload_type, str):
        raise ManifestError("not a DSSE envelope: payloadType is not a string", path=path)
    raw_sigs = obj["signatures"]
    if not isinstance(raw_sigs, list):
        raise ManifestError("not a DSSE envelope: signatures is not a list", path=path)
    sigs = []
    for i, s in enumerate(raw_sigs):
        if not isinstance(s, Mapping) or "sig" not in s:
            raise ManifestError(f"not a DSSE envelope: signatures[{i}] has no 'sig'", path=path)
        keyid = s.get("keyid", "")
        if not isinstance(keyid, str):
            raise ManifestError(f"not a DSSE envelope: signatures[{i}].keyid", path=path)
        sigs.append(Signature(keyid, _b64decode(s["sig"], f"signatures[{i}].sig", path)))
    return Envelope(payload_type, _b64decode(obj["payload"], "payload", path), tuple(sigs))


def valid_signers(
    envelope: Envelope, candidates: Mapping[KeyId, Ed25519PublicKey]
) -> tuple[list[KeyId], list[str], list[str]]:
    """Which of ``candidates`` signed the envelope: (signers, key ids whose signature did
    not match, key ids not among the candidates). The keyid is only a hint (DSSE): an empty
    or unknown one is tried against every candidate."""
    message = pae(envelope.payload_type, envelope.payload)
    signers: list[KeyId] = []
    bad: list[str] = []
    unknown: list[str] = []
    for s in envelope.signatures:
        keyid = KeyId(s.keyid)
        tried = [keyid] if keyid in candidates else list(candidates)
        for kid in tried:
            try:
                candidates[kid].verify(s.sig, message)
            except InvalidSignature:
                continue
            if kid not in signers:
                signers.append(kid)
            break
        else:
            (bad if keyid in candidates else unknown).append(s.keyid or "(no keyid)")
    return signers, bad, unknown
