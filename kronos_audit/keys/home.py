"""The user's key home, ``$KAUDIT_HOME`` (default ``$XDG_CONFIG_HOME/kaudit`` or
``~/.config/kaudit``): the key pairs the user holds (``keys/``) and their own trust store
(``trusted-keys/``); making a key pair, listing them, choosing the one that signs.

Private keys live here, never in a repository, readable by their owner only and
optionally encrypted (``KAUDIT_KEY_PASSPHRASE``).
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kronos_audit._internal.fsutil import write_atomic
from kronos_audit.errors import SigningKeyError
from kronos_audit.keys.keyfile import (
    Passphrase,
    PublicKeyEntry,
    SigningKey,
    check_key_name,
    load_private_key,
    load_public_key,
    public_pem,
)
from kronos_audit.keys.store import TrustStore
from kronos_audit.statement.dsse import key_id


def enclosing_repository(path: Path) -> Path | None:
    """The git work tree (or git directory) that contains ``path``, if any."""
    probe = Path(os.path.abspath(path))
    for candidate in (probe, *probe.parents):
        if (candidate / ".git").exists() or (
            candidate.name.endswith(".git") and (candidate / "HEAD").is_file()
        ):
            return candidate
    return None


def default_home() -> tuple[Path, str]:
    """Where the key home is when ``KAUDIT_HOME`` is not set, and what said so.

    ``$XDG_CONFIG_HOME/kaudit`` when ``XDG_CONFIG_HOME`` is an absolute path (the XDG Base
    Directory specification ignores a relative one), else ``~/.config/kaudit``. Keys made
    before kaudit followed ``XDG_CONFIG_HOME`` are in ``~/.config/kaudit``: while that
    directory exists and ``$XDG_CONFIG_HOME/kaudit`` does not, it stays the home, so that
    setting the variable never hides a user's keys and trust anchors.
    """
    legacy = Path.home() / ".config" / "kaudit"
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(xdg):
        return legacy, "~/.config/kaudit, the default"
    home = Path(xdg) / "kaudit"
    if home != legacy and not home.exists() and legacy.is_dir():
        return legacy, "~/.config/kaudit, kept while $XDG_CONFIG_HOME/kaudit does not exist"
    return home, "$XDG_CONFIG_HOME/kaudit"


def kaudit_home() -> Path:
    """``$KAUDIT_HOME``, else :func:`default_home`: the user's keys and trust anchors.

    Refused inside a git repository: what lies there is content that others can change
    through the repository, so it can anchor nothing (and a private key there would be one
    ``git add`` away from being published).
    """
    env = os.environ.get("KAUDIT_HOME")
    home, source = (Path(env), "KAUDIT_HOME") if env else default_home()
    repo = enclosing_repository(home)
    if repo is not None:
        raise SigningKeyError(
            f"the key home ({source}) is inside the git repository {repo}: keys and "
            "trust anchors must live outside any repository (set KAUDIT_HOME to another "
            "directory)",
            path=home,
        )
    return home


def key_dir() -> Path:
    return kaudit_home() / "keys"


def user_trust_dir() -> Path:
    """The user's own trust store, an anchor: ``$KAUDIT_HOME/trusted-keys``."""
    return kaudit_home() / "trusted-keys"


def generate_key(name: str = "default", *, passphrase: str | None = None) -> SigningKey:
    """Make an Ed25519 key pair in the user's key directory (private key mode 0600,
    encrypted when ``passphrase`` is given) and trust its public half in the user's own
    trust store, so that what this user signs verifies anchored on their machine."""
    check_key_name(name)
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
            load_public_key(pub) if pub.exists() else load_private_key(private_path).public_key()
        )
        entries.append(
            PublicKeyEntry(private_path.stem, key_id(public_key), private_path, public_key)
        )
    return entries


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
    check_key_name(name)
    path = key_dir() / f"{name}.key"
    if not path.exists():
        names = ", ".join(k.name for k in held) or "none"
        raise SigningKeyError(
            f"no signing key named {name!r} in {key_dir()} (held: {names}); "
            "make one with `kaudit keys generate --name NAME`"
        )
    private_key = load_private_key(path, passphrase)
    return SigningKey(name, key_id(private_key.public_key()), private_key)
