"""Whose signatures a verifier accepts, and on whose word: trust anchors and revocations.

"Verify says ok" must mean a signer the *verifier* trusts made these bytes. A repository's
own ``.kaudit/trusted-keys/`` is content anyone with write access to a branch can change,
so on its own it anchors nothing. Anchors come from outside the content verified, as
git's ``gpg.ssh.allowedSignersFile``, in-toto's layout keys and TUF's pinned root do:

=================  ==========================================================
anchor             where the key comes from
=================  ==========================================================
``--trusted-key``  a PEM file named on the command line (repeatable)
``$KAUDIT_TRUSTED_KEYS``  PEM files or directories of them, ``:``-separated
``--trust-ref``    the repository's store as it is at a protected git ref
                   (the base branch in CI), read with git, not from the work tree
``user``           the verifier's own store, ``$KAUDIT_HOME/trusted-keys``
=================  ==========================================================

A key that only the work tree's ``.kaudit/trusted-keys`` vouches for is *unanchored*, and
an unanchored signer fails by default. The everyday case stays smooth because the owner's
own key is in their user trust store (``kaudit keys generate`` puts it there) and a
colleague's is added once with ``kaudit keys trust --user``. The verifier, never the
repository, can accept unanchored signers: ``allow_unanchored`` (``--allow-unanchored``), or
``allow_unanchored = true`` in the ``[trust]`` section of ``$KAUDIT_HOME/config.toml``; each
result then says the signer passed unanchored and who allowed it. An anchor given on the
command line (``--trusted-key``, ``--trust-ref``) says whose word counts, so it overrides
the user's config setting (not an explicit ``--allow-unanchored``).

Revocations (``.kaudit/revocations/KEYID.json``, DSSE-signed statements) can only take
trust away, so they are honoured wherever they are found, once a key of the keyring
(an anchored one when anchors are required) that was itself still valid at the time the
revocation claims has signed them: a revoked key's signatures made at or after the
revocation time fail, and a key revoked (or rotated away) revokes nothing after that.
Without trusted timestamps, "when" is the time each signed record claims. Reading and
settling them is :mod:`kronos_audit.keys.revocation`; their format
:mod:`kronos_audit.statement.revocation`.

``--trust-ref`` is resolved to exactly one fully qualified ref (:func:`resolve_ref`) and
its commit, once; everything read at the ref is read at that commit.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kronos_audit._internal import git
from kronos_audit._internal.safeio import KEY_LIMIT, UnsafeFile, read_regular
from kronos_audit.errors import SigningKeyError, UsageError
from kronos_audit.keys.home import kaudit_home, user_trust_dir
from kronos_audit.keys.keyfile import load_public_key, parse_public_key
from kronos_audit.keys.revocation import (
    REVOCATION_DIR,
    Claimed,
    Revocation,
    parse_utc,
    read_revocation,
    read_revocations_dir,
    settle_revocations,
)
from kronos_audit.keys.store import TrustStore
from kronos_audit.statement.dsse import (
    Envelope,
    KeyId,
    key_id,
    valid_signers,
)

TRUSTED_KEYS_ENV = "KAUDIT_TRUSTED_KEYS"
TRUST_DIR = ".kaudit/trusted-keys"
_REF_LIMIT = 4096  # entries read from a trust ref: a store is tens of keys
UNANCHORED_ADVICE = (
    "anchor it with --trusted-key, --trust-ref or `kaudit keys trust --user` "
    "(or accept it with --allow-unanchored)"
)
"""What a verifier can do about a signer refused as unanchored: the end of that refusal's
detail, which a command listing many refusals says once (see :func:`split_advice`)."""


def split_advice(detail: str) -> tuple[str, str | None]:
    """``detail`` without :data:`UNANCHORED_ADVICE` at its end, and the advice (None when
    it had none): for output that lists many refusals and gives the advice once."""
    tail = f": {UNANCHORED_ADVICE}"
    if detail.endswith(tail):
        return detail[: -len(tail)], UNANCHORED_ADVICE
    return detail, None


class Anchor(StrEnum):
    """What vouches for a key, strongest first."""

    COMMAND_LINE = "--trusted-key"
    """A PEM file the verifier named on the command line."""
    ENVIRONMENT = "KAUDIT_TRUSTED_KEYS"
    """A PEM file (or directory) named in ``$KAUDIT_TRUSTED_KEYS``."""
    TRUST_REF = "--trust-ref"
    """The repository's trust store as it is at a protected git ref."""
    USER = "user trust store"
    """``$KAUDIT_HOME/trusted-keys``: the verifier's own store."""
    REPOSITORY = "repository"
    """Only the work tree's ``.kaudit/trusted-keys``: unanchored."""

    @property
    def anchored(self) -> bool:
        return self is not Anchor.REPOSITORY


_RANK = {a: i for i, a in enumerate(Anchor)}
# Whose name for a key is shown, from sources the verifier trusts first: the user's own
# store, the store at the trust ref, the stem of an anchor file (--trusted-key,
# $KAUDIT_TRUSTED_KEYS); the work tree's store (content) names only what nothing else does.
_NAME_RANK = {
    Anchor.USER: 0,
    Anchor.TRUST_REF: 1,
    Anchor.COMMAND_LINE: 2,
    Anchor.ENVIRONMENT: 2,
    Anchor.REPOSITORY: 3,
}


@dataclass(frozen=True)
class TrustedKey:
    """A public key a verifier accepts, with the anchor that vouches for it."""

    key_id: KeyId
    """Hex sha256 of the raw public key."""
    name: str
    """Its name where it was found (a file stem)."""
    public_key: Ed25519PublicKey
    """The key."""
    anchor: Anchor
    """The strongest source that holds it."""
    source: str
    """Where: a file, or ``COMMIT:path`` for a key read from a git ref."""
    ref: str | None = None
    """For a key read at ``--trust-ref``: the full ref name it was resolved to."""

    @property
    def short_id(self) -> str:
        return self.key_id[:16]

    def describe_anchor(self) -> str:
        """For an ``ok`` line: which anchor trusted the signer."""
        if self.anchor is Anchor.REPOSITORY:
            return f"unanchored: only the repository's {TRUST_DIR} ({self.source}) vouches for it"
        if self.anchor is Anchor.USER:
            return f"anchor: user trust store ({self.source})"
        if self.anchor is Anchor.TRUST_REF and self.ref is not None:
            if self.source.startswith(f"{self.ref}:"):  # a commit id (given, or HEAD's)
                return f"anchor: {self.anchor.value} commit {self.source}"
            return f"anchor: {self.anchor.value} {self.ref} at {self.source}"
        return f"anchor: {self.anchor.value} {self.source}"

    def anchor_label(self) -> str:
        """:meth:`describe_anchor` without where in a store the key file is (the store's
        path, the commit read): what many ``ok`` lines repeat, said once. A file the
        verifier named (``--trusted-key``, ``$KAUDIT_TRUSTED_KEYS``) keeps its name."""
        if self.anchor is Anchor.REPOSITORY:
            return f"unanchored: only the repository's {TRUST_DIR} vouches for it"
        if self.anchor is Anchor.USER:
            return "anchor: user trust store"
        if self.anchor is Anchor.TRUST_REF:
            commit = self.source.split(":", 1)[0]
            if self.ref is None or self.ref == commit:
                return f"anchor: {self.anchor.value} commit {commit[:12]}"
            return f"anchor: {self.anchor.value} {self.ref}"
        return self.describe_anchor()  # a file the verifier named: as they named it

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "key_id": self.key_id,
            "name": self.name,
            "anchor": self.anchor.value,
            "anchored": self.anchor.anchored,
            "source": self.source,
            **({"ref": self.ref} if self.ref is not None else {}),
        }


@dataclass(frozen=True)
class PinnedRef:
    """``--trust-ref`` resolved to exactly one ref and the commit it named then: what is
    read at the ref is read at ``commit``, never by the name again."""

    given: str
    """The name as the verifier gave it."""
    ref: str
    """The one fully qualified ref it names (``refs/remotes/origin/main``), or the
    commit id itself when a full commit id was given."""
    commit: str
    """The full id of the commit read."""
    root: str
    """The repository it was resolved in."""

    def describe(self) -> str:
        """``REF at COMMIT`` (or ``commit COMMIT``), for output."""
        if self.ref == self.commit:
            return f"commit {self.commit}"
        return f"{self.ref} at {self.commit}"

    def to_json_obj(self) -> dict[str, Any]:
        return {"given": self.given, "ref": self.ref, "commit": self.commit}


@dataclass(frozen=True)
class TrustOptions:
    """What a verifier brings: anchors given on the command line, and its policy."""

    trusted_keys: tuple[Path, ...] = ()
    """``--trusted-key FILE``, each a PEM Ed25519 public key."""
    trust_ref: str | None = None
    """``--trust-ref REF``: honour the repository's store only as it is at REF."""
    require_anchor: bool = False
    """``--require-anchor``: a signer only the work tree's store vouches for fails, whatever
    else allows it (the default already, unless the verifier allowed unanchored signers)."""
    allow_unanchored: bool = False
    """``--allow-unanchored``: a signer only the work tree's store vouches for passes,
    reported as unanchored."""
    pinned: PinnedRef | None = None
    """``trust_ref`` already resolved (:meth:`pin`): every reader uses this commit."""

    def pin(self, root: Path) -> TrustOptions:
        """These options with ``trust_ref`` resolved once in the repository at ``root``
        (see :func:`resolve_ref`), so that the trust store, the revocations and the gate's
        configuration are all read at the same commit however the ref moves meanwhile.
        Raises UsageError when the ref is ambiguous or names nothing."""
        if self.trust_ref is None or self.pinned_in(root) is not None:
            return self
        return replace(self, pinned=resolve_ref(root, self.trust_ref))

    def pinned_in(self, root: Path) -> PinnedRef | None:
        """The pinned ref when it was resolved in the repository at ``root``."""
        if self.pinned is None or self.pinned.given != self.trust_ref:
            return None
        return self.pinned if self.pinned.root == str(Path(root).resolve()) else None

    def unanchored_allowed_by(self) -> str | None:
        """Who allowed unanchored signers for this verification (for every result line),
        or None: then a signer only the repository's own store vouches for fails."""
        if self.require_anchor:
            return None
        if self.allow_unanchored:
            return "--allow-unanchored"
        if self.trusted_keys or self.trust_ref is not None:
            return None  # an anchor named for this verification says whose word counts
        return user_config_allows_unanchored()

    @property
    def anchor_required(self) -> bool:
        """Whether an unanchored signer fails (see :meth:`unanchored_allowed_by`)."""
        return self.unanchored_allowed_by() is None


USER_CONFIG = "config.toml"
"""The user's own settings, ``$KAUDIT_HOME/config.toml``: never a repository's."""


def user_config_allows_unanchored() -> str | None:
    """``allow_unanchored = true`` in ``[trust]`` of the user's config: its path, or None.

    A config that cannot be read or is malformed raises UsageError naming it: a setting
    that decides trust is never guessed.
    """
    path = kaudit_home() / USER_CONFIG
    try:
        data = read_regular(path, KEY_LIMIT)
    except UnsafeFile as e:
        if e.missing:
            return None
        raise UsageError(f"your kaudit config cannot be read: {e.reason}", path=path) from None
    import tomllib  # only with a config to read: verify's start-up stays small

    try:
        table = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"your kaudit config is not TOML: {e}", path=path) from None
    trust = table.get("trust", {})
    value = trust.get("allow_unanchored", False) if isinstance(trust, dict) else None
    if not isinstance(value, bool):
        raise UsageError("[trust] allow_unanchored must be true or false", path=path)
    return str(path) if value else None


@dataclass(frozen=True)
class SignerCheck:
    """Whether an envelope was signed by a key a keyring accepts, and by whom."""

    ok: bool
    """A signature verifies under an accepted key (anchored if anchors are required,
    not revoked at the time of signing)."""
    detail: str
    """Who signed and on whose word, or why it failed."""
    signer: TrustedKey | None = None
    """The accepted signer (or the unanchored/revoked one that was refused)."""


@dataclass
class Keyring:
    """The keys one verification accepts, each with its anchor, and the revocations."""

    keys: dict[KeyId, TrustedKey] = field(default_factory=dict)
    """The accepted keys, each under its strongest anchor."""
    revocations: dict[KeyId, Revocation] = field(default_factory=dict)
    """Honoured revocations, by revoked key (the earliest if several)."""
    problems: list[str] = field(default_factory=list)
    """Entries skipped on reading (symlinks, FIFOs, not Ed25519 keys, bad revocations)."""
    require_anchor: bool = False
    """Unanchored signers fail."""
    unanchored_allowed_by: str | None = None
    """Who let unanchored signers pass (``--allow-unanchored``, the user's config file),
    when they do: said in every result such a signer gets."""

    trust_ref: PinnedRef | None = None
    """``--trust-ref`` as resolved for this keyring, when one was given."""
    _names: dict[KeyId, tuple[int, str]] = field(default_factory=dict, repr=False)

    def add(
        self,
        public_key: Ed25519PublicKey,
        name: str,
        anchor: Anchor,
        source: str,
        ref: str | None = None,
    ) -> None:
        kid = key_id(public_key)
        current = self.keys.get(kid)
        if current is None or _RANK[anchor] < _RANK[current.anchor]:
            self.keys[kid] = TrustedKey(kid, name, public_key, anchor, source, ref)
        # One name for a key whichever anchor vouches for it (see _NAME_RANK): a PEM handed
        # over as owner.pub reads as the alice the user's own store calls it.
        best = self._names.get(kid)
        if best is None or _NAME_RANK[anchor] < best[0]:
            self._names[kid] = (_NAME_RANK[anchor], name)
        named = self._names[kid][1]
        if self.keys[kid].name != named:
            self.keys[kid] = replace(self.keys[kid], name=named)

    @property
    def anchored(self) -> tuple[TrustedKey, ...]:
        return tuple(k for k in self.keys.values() if k.anchor.anchored)

    def check(self, envelope: Envelope, signed_at: str | None) -> SignerCheck:
        """Accept ``envelope`` if one of its signatures verifies under a key this keyring
        accepts at ``signed_at`` (the time the statement says it was made)."""
        if not envelope.signatures:
            return SignerCheck(False, "the envelope has no signature")
        candidates = {kid: k.public_key for kid, k in self.keys.items()}
        signers, bad, unknown = valid_signers(envelope, candidates)
        refused: SignerCheck | None = None
        for kid in signers:
            verdict, revoked = self._judge(kid, signed_at)
            if verdict.ok:
                return verdict
            refused = verdict if revoked else (refused or verdict)
        if refused is not None:
            return refused
        if bad:
            return SignerCheck(
                False,
                "signature does not match the payload (key " + ", ".join(k[:16] for k in bad) + ")",
            )
        return SignerCheck(
            False,
            "signed by a key no trust anchor holds: " + ", ".join(k[:16] for k in unknown),
        )

    def accepts(self, kid: KeyId, signed_at: str | None) -> bool:
        """Whether a signature by key ``kid``, made at ``signed_at``, counts with this
        keyring (as :meth:`check` judges a signature that verifies under that key)."""
        key = self.keys.get(kid)
        if key is None:
            return False
        if kid not in self.revocations:  # then the time does not matter (see _judge)
            return not self.require_anchor or key.anchor.anchored
        return self._judge(kid, signed_at)[0].ok

    def _judge(self, kid: KeyId, signed_at: str | None) -> tuple[SignerCheck, bool]:
        """The verdict on a signature that verifies under key ``kid`` (one of
        :attr:`keys`), made at ``signed_at``; and whether a refusal is for a revocation."""
        key = self.keys[kid]
        who = f"{key.name} (key {key.short_id})"
        revoked = self.revocations.get(kid)
        if revoked is not None:
            when, since = parse_utc(signed_at or ""), parse_utc(revoked.revoked_at)
            if when is None or since is None or when >= since:
                return SignerCheck(
                    False,
                    f"signed by {who}, which was revoked at {revoked.revoked_at} "
                    f"({revoked.reason}); signatures from then on are refused",
                    key,
                ), True
        if self.require_anchor and not key.anchor.anchored:
            return SignerCheck(
                False,
                f"signed by {who}, which only the repository's own {TRUST_DIR} vouches "
                f"for (unanchored): {UNANCHORED_ADVICE}",
                key,
            ), False
        note = (
            f"; key revoked at {revoked.revoked_at}, this was signed before"
            if revoked is not None
            else ""
        )
        if not key.anchor.anchored:
            note += f"; passed unanchored, as {self.unanchored_allowed_by or 'allowed'} says"
        return SignerCheck(True, f"signed by {who}, {key.describe_anchor()}{note}", key), False


# -- reading the anchors ---------------------------------------------------------------


def _add_store(keyring: Keyring, directory: Path, anchor: Anchor) -> None:
    store = TrustStore(directory)
    for entry in store.entries().values():
        keyring.add(entry.public_key, entry.name, anchor, str(entry.path))
    keyring.problems.extend(str(p) for p in store.problems)


def _add_explicit(keyring: Keyring, path: Path, anchor: Anchor) -> None:
    """A key the verifier named: anything wrong with it is bad input, not a skip."""
    if path.is_dir():
        store = TrustStore(path)
        entries = store.entries()
        keyring.problems.extend(str(p) for p in store.problems)
        if not entries:
            raise SigningKeyError(f"{anchor.value}: no Ed25519 public key (*.pub) here", path=path)
        for entry in entries.values():
            keyring.add(entry.public_key, entry.name, anchor, str(entry.path))
        return
    public_key = load_public_key(path)
    keyring.add(public_key, path.name.removesuffix(".pub"), anchor, str(path))


# The places git's rules (gitrevisions(7)) look for a short name, in git's order;
# $GIT_DIR/NAME (HEAD, FETCH_HEAD) is not among them: those are no protected ref.
_SHORT_NAME_RULES = (
    "refs/{}",
    "refs/tags/{}",
    "refs/heads/{}",
    "refs/remotes/{}",
    "refs/remotes/{}/HEAD",
)
_FULL_OBJECT_ID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
# BRANCH@{upstream} and BRANCH@{push} (gitrevisions(7)), BRANCH empty for the current one:
# git's configuration says which one ref each names.
_UPSTREAM = re.compile(r"^[^\s@{}~^:?*\[\\]*@\{(?:u|upstream|push)\}$", re.IGNORECASE)


def resolve_ref(root: Path, ref: str) -> PinnedRef:
    """``ref`` resolved to exactly one ref of the repository at ``root`` and the commit it
    names now.

    A full name (``refs/...``) must exist as it is. A short name is looked up in every
    place git's rules would consider (``refs/NAME``, ``refs/tags/NAME``,
    ``refs/heads/NAME``, ``refs/remotes/NAME``, ``refs/remotes/NAME/HEAD``), and exactly
    one must exist: git would silently prefer a pushed tag ``origin/main`` to the
    remote-tracking branch, so two candidates are refused, never ranked. A full commit id
    (40 or 64 hex digits) is taken as that commit; an abbreviated one is not a ref.
    ``HEAD`` is the commit checked out now, pinned as that commit id (the name moves with
    every checkout). ``@{u}`` (``@{upstream}``, ``@{push}``, ``BRANCH@{u}``) is the one
    ref git's configuration names for it (``refs/remotes/origin/main``).
    Raises UsageError for anything else.
    """
    if not ref or ref.startswith("-") or any(c in ref for c in "\0\n"):
        raise UsageError(f"--trust-ref {ref!r}: not a git ref name")
    where = str(Path(root).resolve())
    try:
        if _FULL_OBJECT_ID.match(ref):
            commit = git.commit_of(root, ref)
            if commit is None:
                raise UsageError(f"--trust-ref {ref}: no such commit in this repository", path=root)
            return PinnedRef(ref, commit, commit, where)
        if ref == "HEAD":
            commit = git.commit_of(root, ref)
            if commit is None:
                raise UsageError("--trust-ref HEAD: this repository has no commit yet", path=root)
            return PinnedRef(ref, commit, commit, where)
        if _UPSTREAM.match(ref):
            candidates = [git.symbolic_full_name(root, ref)]
        elif ref.startswith("refs/"):
            candidates = [ref]
        else:
            candidates = [r.format(ref) for r in _SHORT_NAME_RULES]
        found = git.refs_named(root, candidates)
        if len(found) > 1:
            raise UsageError(
                f"--trust-ref {ref}: ambiguous, it names {len(found)} refs: "
                + ", ".join(found)
                + "; give the full name of the protected one (refs/...)",
                path=root,
            )
        if not found:
            looked = "" if len(candidates) == 1 else f" (looked for {', '.join(candidates)})"
            raise UsageError(
                f"--trust-ref {ref}: no such ref in this repository{looked}; "
                "a commit id must be given in full",
                path=root,
            )
        ((full, oid),) = found.items()
        # Peel the object id git listed (an annotated tag's), never the name again.
        commit = git.commit_of(root, oid)
    except git.GitError as e:
        raise UsageError(f"--trust-ref {ref}: {e.message}", path=root) from None
    if commit is None:
        raise UsageError(f"--trust-ref {ref}: {full} names no commit", path=root)
    return PinnedRef(ref, full, commit, where)


def read_tree_files(
    root: Path, commit: str, directory: str, suffix: str
) -> tuple[list[tuple[str, bytes]], list[str]]:
    """The regular files ``directory/*suffix`` as they are at ``commit`` (name, bytes),
    read from git's object store; and the entries skipped (symlinks, submodules, too big).

    Nothing when the commit has no such directory; GitError (one line) when the objects
    cannot be read: an unreadable store, revocation list or configuration at a trust ref
    is never taken for an empty one."""
    files: list[tuple[str, bytes]] = []
    skipped: list[str] = []
    with git.objects(root) as store:
        for entry in store.tree(commit, directory, limit=_REF_LIMIT):
            if not entry.path.endswith(suffix):
                continue
            where = f"{commit[:12]}:{entry.path}"
            if entry.kind != "blob" or entry.mode not in ("100644", "100755"):
                skipped.append(
                    f"{where}: not a regular file at the ref (mode {entry.mode}): skipped"
                )
                continue
            if entry.size is None or entry.size > KEY_LIMIT:
                skipped.append(f"{where}: larger than {KEY_LIMIT} bytes: skipped")
                continue
            files.append((entry.path, store.blob(entry.oid, limit=KEY_LIMIT)))
    return files, skipped


def _add_ref(keyring: Keyring, root: Path, pinned: PinnedRef) -> None:
    files, skipped = read_tree_files(root, pinned.commit, TRUST_DIR, ".pub")
    keyring.problems.extend(skipped)
    for path, data in files:
        where = f"{pinned.commit}:{path}"
        try:
            public_key = parse_public_key(data, where)
        except SigningKeyError as e:
            keyring.problems.append(f"{pinned.ref} at {where}: {e.message}: skipped")
            continue
        name = Path(path).name.removesuffix(".pub")
        keyring.add(public_key, name, Anchor.TRUST_REF, where, pinned.ref)


# -- the whole -------------------------------------------------------------------------


def _env_paths() -> list[Path]:
    raw = os.environ.get(TRUSTED_KEYS_ENV, "")
    return [Path(p) for p in raw.split(os.pathsep) if p.strip()]


def load_keyring(project_root: Path | None, options: TrustOptions | None = None) -> Keyring:
    """The keyring one verification uses: anchors first, then the work tree's store
    (unanchored, and not at all under ``--trust-ref``), then every revocation found."""
    options = options or TrustOptions()
    allowed_by = options.unanchored_allowed_by()
    keyring = Keyring(require_anchor=allowed_by is None, unanchored_allowed_by=allowed_by)
    for path in options.trusted_keys:
        _add_explicit(keyring, Path(path), Anchor.COMMAND_LINE)
    for path in _env_paths():
        _add_explicit(keyring, path, Anchor.ENVIRONMENT)
    _add_store(keyring, user_trust_dir(), Anchor.USER)
    if options.trust_ref is not None:
        if project_root is None:
            raise UsageError("--trust-ref needs a git repository")
        pinned = options.pinned_in(project_root) or resolve_ref(project_root, options.trust_ref)
        keyring.trust_ref = pinned
        _add_ref(keyring, project_root, pinned)
    elif project_root is not None:
        _add_store(keyring, project_root / TRUST_DIR, Anchor.REPOSITORY)
    # Revocations only take trust away: honour them from every place they may be.
    claims: list[Claimed] = []
    read_revocations_dir(claims, keyring.problems, user_trust_dir().parent / "revocations")
    if project_root is not None:
        read_revocations_dir(claims, keyring.problems, project_root / REVOCATION_DIR)
        if keyring.trust_ref is not None:
            pinned = keyring.trust_ref
            files, skipped = read_tree_files(project_root, pinned.commit, REVOCATION_DIR, ".json")
            keyring.problems.extend(skipped)
            for name, data in files:
                where = f"{pinned.ref} at {pinned.commit}:{name}"
                read_revocation(claims, keyring.problems, data, where, Path(name).name)
    candidates = {
        kid: k.public_key
        for kid, k in keyring.keys.items()
        if k.anchor.anchored or not keyring.require_anchor
    }
    names = {kid: k.name for kid, k in keyring.keys.items()}
    keyring.revocations, problems = settle_revocations(claims, candidates, names)
    keyring.problems.extend(problems)
    return keyring


def describe(keys: Iterable[TrustedKey]) -> Mapping[str, list[TrustedKey]]:
    """Keys grouped by anchor, strongest first (for ``kaudit keys list``)."""
    grouped: dict[str, list[TrustedKey]] = {}
    for k in sorted(keys, key=lambda k: (_RANK[k.anchor], k.name)):
        grouped.setdefault(k.anchor.value, []).append(k)
    return grouped


__all__ = [
    "UNANCHORED_ADVICE",
    "Anchor",
    "Keyring",
    "PinnedRef",
    "SignerCheck",
    "TrustOptions",
    "TrustedKey",
    "load_keyring",
    "split_advice",
]
