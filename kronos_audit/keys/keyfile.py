"""Ed25519 keys, the repository's trust store, and DSSE envelopes.

A manifest is a DSSE envelope (https://github.com/secure-systems-lab/dsse): the signature
is over the pre-authentication encoding PAE(payloadType, payload), so it covers the
payload type too. A key is named by its key id, the hex sha256 of the raw 32-byte public
key. Private keys live in the user's key directory (``$KAUDIT_HOME/keys``, default
``~/.config/kaudit/keys``), never in a repository, readable by their owner only and
optionally encrypted (``KAUDIT_KEY_PASSPHRASE``). Which public keys a verifier accepts,
and on whose word, is :mod:`kronos_audit.keys.anchors`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NewType

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kronos_audit._internal.fsutil import write_atomic
from kronos_audit._internal.safeio import KEY_LIMIT, UnsafeFile, read_regular
from kronos_audit.errors import ManifestError, SigningKeyError

KeyId = NewType("KeyId", str)
"""Hex sha256 of a raw 32-byte Ed25519 public key."""

PAYLOAD_TYPE = "application/vnd.in-toto+json"
KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
PASSPHRASE_ENV = "KAUDIT_KEY_PASSPHRASE"

Passphrase = Callable[[str], str]
"""Asked for the passphrase of an encrypted private key, given the key's name."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding of ``payload`` with its type."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def key_id(public_key: Ed25519PublicKey) -> KeyId:
    """The key id of ``public_key``: hex sha256 of its raw bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return KeyId(hashlib.sha256(raw).hexdigest())


def public_pem(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def parse_public_key(data: bytes, path: Path | str) -> Ed25519PublicKey:
    """A PEM (SubjectPublicKeyInfo) Ed25519 public key from ``data`` read at ``path``."""
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        raise SigningKeyError("not a PEM public key", path=path) from None
    except Exception:  # cryptography's parsers raise a few kinds for hostile DER
        raise SigningKeyError("not a PEM public key", path=path) from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError("not an Ed25519 public key", path=path)
    return key


def load_public_key(path: Path, *, follow_symlinks: bool = True) -> Ed25519PublicKey:
    """Read a PEM (SubjectPublicKeyInfo) Ed25519 public key from a regular file."""
    try:
        data = read_regular(path, KEY_LIMIT, follow_symlinks=follow_symlinks)
    except UnsafeFile as e:
        raise SigningKeyError(f"cannot read public key: {e.reason}", path=path) from None
    return parse_public_key(data, path)


@dataclass(frozen=True)
class SigningKey:
    """A private key the user holds."""

    name: str
    """File stem in the key directory."""
    key_id: KeyId
    """Hex sha256 of the public key."""
    private_key: Ed25519PrivateKey
    """The key itself."""

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)


@dataclass(frozen=True)
class PublicKeyEntry:
    """A public key, held by the user or trusted by a repository."""

    name: str
    """File stem."""
    key_id: KeyId
    """Hex sha256 of the public key."""
    path: Path
    """Where it is stored."""
    public_key: Ed25519PublicKey
    """The key itself."""


def enclosing_repository(path: Path) -> Path | None:
    """The git work tree (or git directory) that contains ``path``, if any."""
    probe = Path(os.path.abspath(path))
    for candidate in (probe, *probe.parents):
        if (candidate / ".git").exists() or (
            candidate.name.endswith(".git") and (candidate / "HEAD").is_file()
        ):
            return candidate
    return None


def kaudit_home() -> Path:
    """``$KAUDIT_HOME``, else ``~/.config/kaudit``: the user's keys and trust anchors.

    Refused inside a git repository: what lies there is content that others can change
    through the repository, so it can anchor nothing (and a private key there would be one
    ``git add`` away from being published).
    """
    env = os.environ.get("KAUDIT_HOME")
    home = Path(env) if env else Path.home() / ".config" / "kaudit"
    repo = enclosing_repository(home)
    if repo is not None:
        raise SigningKeyError(
            f"KAUDIT_HOME is inside the git repository {repo}: keys and trust anchors "
            "must live outside any repository (set KAUDIT_HOME to another directory)",
            path=home,
        )
    return home


def key_dir() -> Path:
    return kaudit_home() / "keys"


def user_trust_dir() -> Path:
    """The user's own trust store, an anchor: ``$KAUDIT_HOME/trusted-keys``."""
    return kaudit_home() / "trusted-keys"


def _check_name(name: str) -> None:
    if not KEY_NAME.match(name):
        raise SigningKeyError(
            f"invalid key name {name!r}: use letters, digits, '.', '_' or '-' (at most 64)"
        )


def generate_key(name: str = "default", *, passphrase: str | None = None) -> SigningKey:
    """Make an Ed25519 key pair in the user's key directory (private key mode 0600,
    encrypted when ``passphrase`` is given) and trust its public half in the user's own
    trust store, so that what this user signs verifies anchored on their machine."""
    _check_name(name)
    directory = key_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    private_path = directory / f"{name}.key"
    if private_path.exists():
        raise SigningKeyError(
            "a key with this name exists already; pick another with --name", path=private_path
        )
    if passphrase is not None and not passphrase:
        raise SigningKeyError("an empty passphrase encrypts nothing", path=private_path)
    private_key = Ed25519PrivateKey.generate()
    encryption: serialization.KeySerializationEncryption = (
        serialization.NoEncryption()
        if passphrase is None
        else serialization.BestAvailableEncryption(passphrase.encode())
    )
    pem = private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )
    # The public half first: a crash in between leaves no private key without its public one.
    write_atomic(directory / f"{name}.pub", public_pem(private_key.public_key()))
    write_atomic(private_path, pem, mode=0o600, overwrite=False)
    TrustStore(user_trust_dir()).add(private_key.public_key(), name)
    return SigningKey(name, key_id(private_key.public_key()), private_key)


def held_keys() -> list[PublicKeyEntry]:
    """The key pairs in the user's key directory, by name (read from their public halves,
    so that an encrypted key needs no passphrase to be listed)."""
    directory = key_dir()
    if not directory.is_dir():
        return []
    entries = []
    for private_path in sorted(directory.glob("*.key")):
        pub = private_path.with_suffix(".pub")
        public_key = (
            load_public_key(pub) if pub.exists() else _load_private(private_path).public_key()
        )
        entries.append(
            PublicKeyEntry(private_path.stem, key_id(public_key), private_path, public_key)
        )
    return entries


def _read_private(path: Path) -> bytes:
    """The private key file's bytes, refused (as ssh refuses it) when group or others may
    read or write it: such a key may already be someone else's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SigningKeyError("private key not found", path=path) from None
    except OSError as e:
        raise SigningKeyError(f"cannot read private key: {e.strerror}", path=path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SigningKeyError("a private key must be a regular file", path=path)
        if st.st_mode & 0o077:
            mode = stat.S_IMODE(st.st_mode)
            raise SigningKeyError(
                f"permissions {mode:04o} are too open: a private key must be accessible by "
                f"its owner only (chmod 600 {path})",
                path=path,
            )
        if st.st_size > KEY_LIMIT:
            raise SigningKeyError("too large to be a private key", path=path)
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(KEY_LIMIT + 1)
    finally:
        os.close(fd)


def _load_private(path: Path, passphrase: Passphrase | None = None) -> Ed25519PrivateKey:
    data = _read_private(path)
    secret: bytes | None = None
    if b"ENCRYPTED" in data.split(b"\n", 1)[0]:
        text = os.environ.get(PASSPHRASE_ENV)
        if text is None and passphrase is not None:
            text = passphrase(path.stem)
        if not text:
            raise SigningKeyError(
                f"the private key is encrypted: give its passphrase in {PASSPHRASE_ENV} "
                "(or run kaudit on a terminal to be asked)",
                path=path,
            )
        secret = text.encode()
    try:
        key = serialization.load_pem_private_key(data, password=secret)
    except TypeError:
        raise SigningKeyError("not an unencrypted PEM private key", path=path) from None
    except ValueError:
        what = "wrong passphrase, or " if secret is not None else ""
        raise SigningKeyError(f"{what}not a PEM private key", path=path) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError("not an Ed25519 private key", path=path)
    return key


def select_key(name: str | None = None, *, passphrase: Passphrase | None = None) -> SigningKey:
    """The signing key: ``name``, else ``$KAUDIT_KEY``, else the only key held.

    An encrypted key's passphrase comes from ``$KAUDIT_KEY_PASSPHRASE``, else from
    ``passphrase`` (the CLI asks on a terminal), else it is an error.
    """
    name = name or os.environ.get("KAUDIT_KEY") or None
    held = held_keys()
    if name is None:
        if not held:
            raise SigningKeyError(
                f"no signing key in {key_dir()}: make one with `kaudit keys generate`"
            )
        if len(held) > 1:
            names = ", ".join(k.name for k in held)
            raise SigningKeyError(
                f"several signing keys held ({names}): pick one with --key NAME or KAUDIT_KEY"
            )
        name = held[0].name
    _check_name(name)
    path = key_dir() / f"{name}.key"
    if not path.exists():
        names = ", ".join(k.name for k in held) or "none"
        raise SigningKeyError(
            f"no signing key named {name!r} in {key_dir()} (held: {names}); "
            "make one with `kaudit keys generate --name NAME`"
        )
    private_key = _load_private(path, passphrase)
    return SigningKey(name, key_id(private_key.public_key()), private_key)


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
        _check_name(name)
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


def sign_envelope(payload: bytes, key: SigningKey, payload_type: str = PAYLOAD_TYPE) -> Envelope:
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
