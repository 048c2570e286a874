"""Key files: Ed25519 public keys in PEM, private keys as their owner alone may read them,
and the names keys go by.

A public key is a PEM SubjectPublicKeyInfo file (``NAME.pub``); a private key a PKCS#8 PEM
file (``NAME.key``, mode 0600, optionally encrypted). Where the user's keys live is
:mod:`kronos_audit.keys.home`; DSSE envelopes and key ids are
:mod:`kronos_audit.statement.dsse`.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kronos_audit._internal.safeio import KEY_LIMIT, UnsafeFile, read_regular
from kronos_audit.errors import SigningKeyError
from kronos_audit.statement.dsse import KeyId

KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
PASSPHRASE_ENV = "KAUDIT_KEY_PASSPHRASE"

Passphrase = Callable[[str], str]
"""Asked for the passphrase of an encrypted private key, given the key's name."""


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


def check_key_name(name: str) -> None:
    """Refuse a key name that is not a plain file stem (:data:`KEY_NAME`)."""
    if not KEY_NAME.match(name):
        raise SigningKeyError(
            f"invalid key name {name!r}: use letters, digits, '.', '_' or '-' (at most 64)"
        )


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


def load_private_key(path: Path, passphrase: Passphrase | None = None) -> Ed25519PrivateKey:
    """The private key at ``path`` (refused unless its owner alone may read it); an
    encrypted one is opened with ``$KAUDIT_KEY_PASSPHRASE``, else ``passphrase``."""
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
