"""Revocations, read and settled: which signed revocations take trust away from a key.

Revocations (``.kaudit/revocations/KEYID.json``; the format is
:mod:`kronos_audit.statement.revocation`) can only take trust away, so they are honoured
wherever they are found, once a key the verification accepts (an anchored one when anchors
are required) that was itself still valid at the time the revocation claims has signed
them. Without trusted timestamps, "when" is the time each signed record claims. Where
they are read from is :func:`kronos_audit.keys.anchors.load_keyring`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kronos_audit._internal.fsutil import write_atomic
from kronos_audit._internal.safeio import KEY_LIMIT, UnsafeFile, read_regular
from kronos_audit.errors import ManifestError, UsageError
from kronos_audit.keys.keyfile import SigningKey
from kronos_audit.statement.dsse import Envelope, KeyId, valid_signers
from kronos_audit.statement.revocation import encode_revocation, parse_revocation

REVOCATION_DIR = ".kaudit/revocations"
_KEY_ID = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Revocation:
    """A signed statement that a key is no longer to be trusted from a time on."""

    key_id: KeyId
    """The key revoked."""
    revoked_at: str
    """RFC 3339 UTC: signatures made at or after this time fail."""
    reason: str
    """Why, in the revoker's words."""
    signer: KeyId
    """The key that signed the revocation."""
    source: str
    """Where it was read."""


def parse_utc(text: str) -> dt.datetime | None:
    """An RFC 3339 time with its offset, or None (a time without one is none)."""
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


@dataclass(frozen=True)
class Claimed:
    """A revocation read and well formed, not yet known to count."""

    envelope: Envelope
    revoked: KeyId
    at: dt.datetime
    statement: dict[str, Any]
    where: str


def read_revocation(
    claims: list[Claimed], problems: list[str], data: bytes, where: str, name: str
) -> None:
    """Add the revocation in ``data`` (read at ``where``, a file named ``name``) to
    ``claims`` when it is well formed, else say why not in ``problems``."""
    try:
        envelope, statement = parse_revocation(data, where)
    except ManifestError as e:
        problems.append(f"{e}: skipped")
        return
    revoked = KeyId(statement["key_id"])
    if name != f"{revoked}.json":
        problems.append(f"{where}: a revocation's file is named KEYID.json: skipped")
        return
    at = parse_utc(statement["revoked_at"])
    if at is None:
        problems.append(f"{where}: revoked_at is not a time: skipped")
        return
    claims.append(Claimed(envelope, revoked, at, statement, where))


def settle_revocations(
    claims: Iterable[Claimed],
    candidates: Mapping[KeyId, Ed25519PublicKey],
    names: Mapping[KeyId, str],
) -> tuple[dict[KeyId, Revocation], list[str]]:
    """The revocations that count, by revoked key, and the problems met on the way (one
    line each): those whose signer was valid when each was issued.

    A revocation counts when one of ``candidates`` (the keys this verification accepts: the
    anchored ones when anchors are required) signed it and that key was not itself revoked
    (a rotation is the old key's revocation of itself) at or before the time the revocation
    claims. They are settled in the order of those claimed times, earliest first, so a key
    rotated away cannot revoke its successor later, while what it revoked before still
    stands. Two revocations claiming the same instant are judged against what was revoked
    before it: both count (taking trust away is the safe side of a tie). ``names`` names
    each candidate in the problems.
    """
    revocations: dict[KeyId, Revocation] = {}
    problems: list[str] = []
    since: dict[KeyId, dt.datetime] = {}  # revoked key -> earliest counted time
    claims = sorted(claims, key=lambda c: (c.at, c.where))
    i = 0
    while i < len(claims):
        same = [c for c in claims[i:] if c.at == claims[i].at]
        i += len(same)
        before = dict(since)
        for claim in same:
            signers, _, _ = valid_signers(claim.envelope, candidates)
            if not signers:
                problems.append(
                    f"{claim.where}: revocation not signed by a key this verification "
                    "trusts: skipped"
                )
                continue
            if claim.revoked in before:
                continue  # revoked already, from an earlier time: nothing to take away
            valid = [kid for kid in signers if kid not in before]
            if not valid:
                gone = revocations[signers[0]]
                problems.append(
                    f"{claim.where}: revocation of {claim.revoked[:16]} ignored: its signer "
                    f"{names[signers[0]]} ({signers[0][:16]}) was revoked at {gone.revoked_at} "
                    f"({gone.reason}), at or before this revocation's "
                    f"{claim.statement['revoked_at']}: a revoked key revokes nothing"
                )
                continue
            if claim.revoked in since:
                continue  # revoked at this same instant by another revocation already
            since[claim.revoked] = claim.at
            revocations[claim.revoked] = Revocation(
                claim.revoked,
                claim.statement["revoked_at"],
                claim.statement["reason"],
                valid[0],
                claim.where,
            )
    return revocations, problems


def read_revocations_dir(claims: list[Claimed], problems: list[str], directory: Path) -> None:
    """:func:`read_revocation` of every ``*.json`` regular file in ``directory``."""
    if not directory.is_dir() or directory.is_symlink():
        return
    for path in sorted(directory.glob("*.json")):
        try:
            data = read_regular(path, KEY_LIMIT, follow_symlinks=False)
        except UnsafeFile as e:
            problems.append(f"{path}: {e.reason}: skipped")
            continue
        read_revocation(claims, problems, data, str(path), path.name)


def write_revocation(
    project_root: Path, revoked: KeyId, reason: str, signer: SigningKey, *, at: str | None = None
) -> Path:
    """Sign a revocation of ``revoked`` with ``signer`` into the repository's
    ``.kaudit/revocations/KEYID.json`` (to be committed)."""
    if not _KEY_ID.match(revoked):
        raise UsageError(f"{revoked!r} is not a key id (64 hex digits)")
    if not reason.strip():
        raise UsageError("--reason: say why the key is revoked")
    revoked_at = at or dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    data = encode_revocation(revoked, reason.strip(), revoked_at, signer)
    path = project_root / REVOCATION_DIR / f"{revoked}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)
    return path
