"""Trust stores: directories of trusted public keys, and checking an envelope against one.

The user's own store is ``$KAUDIT_HOME/trusted-keys``, a repository's is
``.kaudit/trusted-keys``. Which stores a verifier accepts, and on whose word, is
:mod:`kronos_audit.keys.anchors`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kronos_audit._internal.fsutil import write_atomic
from kronos_audit.errors import SigningKeyError
from kronos_audit.keys.keyfile import PublicKeyEntry, check_key_name, load_public_key, public_pem
from kronos_audit.statement.dsse import Envelope, KeyId, key_id, valid_signers


@dataclass(frozen=True)
class StoreProblem:
    """A trust store entry that was skipped, and why."""

    path: Path
    """The entry."""
    reason: str
    """Why it was not taken (a symlink, a FIFO, not an Ed25519 public key, ...)."""

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}: skipped"


class TrustStore:
    """A directory of trusted public keys, ``*.pub`` (PEM): the user's own
    (``$KAUDIT_HOME/trusted-keys``) or a repository's (``.kaudit/trusted-keys``).

    Anyone may have written a repository's store, so an entry is taken only if it is a
    regular file (not a symlink, which could name a key elsewhere; not a FIFO, which would
    block) holding an Ed25519 public key. Every other entry is reported in
    :attr:`problems` and skipped: one bad file never stops a verification.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._entries: dict[KeyId, PublicKeyEntry] | None = None
        self.problems: list[StoreProblem] = []
        """Entries skipped on reading, one by one."""

    def entries(self) -> dict[KeyId, PublicKeyEntry]:
        if self._entries is None:
            found: dict[KeyId, PublicKeyEntry] = {}
            if self.directory.is_symlink():
                self.problems.append(
                    StoreProblem(self.directory, "the trust store is a symbolic link")
                )
            elif self.directory.is_dir():
                for path in sorted(self.directory.glob("*.pub")):
                    try:
                        public_key = load_public_key(path, follow_symlinks=False)
                    except SigningKeyError as e:
                        self.problems.append(StoreProblem(path, e.message))
                        continue
                    kid = key_id(public_key)
                    found.setdefault(kid, PublicKeyEntry(path.stem, kid, path, public_key))
            self._entries = found
        return self._entries

    def add(self, public_key: Ed25519PublicKey, name: str) -> PublicKeyEntry:
        """Trust ``public_key`` under ``name``; trusting a key twice is a no-op."""
        check_key_name(name)
        kid = key_id(public_key)
        existing = self.entries().get(kid)
        if existing is not None:
            return existing
        path = self.directory / f"{name}.pub"
        if path.exists() or path.is_symlink():
            raise SigningKeyError(
                "another key is trusted under this name; pick another with --name", path=path
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomic(path, public_pem(public_key), overwrite=False)
        entry = PublicKeyEntry(name, kid, path, public_key)
        self.entries()[kid] = entry
        return entry


@dataclass(frozen=True)
class SignatureCheck:
    """Outcome of checking an envelope's signatures against a trust store."""

    ok: bool
    """At least one signature verifies under a trusted key."""
    signers: tuple[KeyId, ...]
    """Trusted key ids whose signature verified."""
    detail: str
    """Why it failed, or who signed."""


def verify_envelope(envelope: Envelope, trust: TrustStore) -> SignatureCheck:
    """Accept the envelope when any signature verifies under a key of one directory store
    (the anchors and their rules are :class:`kronos_audit.keys.anchors.Keyring`)."""
    if not envelope.signatures:
        return SignatureCheck(False, (), "the envelope has no signature")
    keys = {kid: e.public_key for kid, e in trust.entries().items()}
    signers, bad, untrusted = valid_signers(envelope, keys)
    if signers:
        return SignatureCheck(
            True, tuple(signers), "signed by " + ", ".join(k[:16] for k in signers)
        )
    if bad:
        return SignatureCheck(
            False,
            (),
            "signature does not match the payload (key " + ", ".join(k[:16] for k in bad) + ")",
        )
    return SignatureCheck(
        False,
        (),
        "signed by a key this repository does not trust: " + ", ".join(k[:16] for k in untrusted),
    )
