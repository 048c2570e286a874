"""What this machine already verified of a run's chain: a restore walks only what is new.

A restore verifies the chain of the step it takes (step 5 of docs/security.md's "The steps
of a verification"): every parent manifest back to the run's first is there with the
recorded digest, signed by a key the restore accepts, of the same run at an earlier step.
Read, parsed and checked link by link, that costs each restore a little more than the one
before. The run's writer already knows most of it: it verified the chain when it restored,
and it signed every step since over a parent it had in hand.

So the writer (rank 0, which holds the run's private key) keeps a memo of it, one line a
manifest: its digest and its parent's, its run and step, where it is in the run's
directory, the identity of that file when its bytes were read (device, inode, size,
modification and change times, from the descriptor they were read through), and the keys
whose signature on it verified, with the time it claims. A later restore of the same run,
on this machine, with the same key, checks the chain below a manifest the memo holds by
the memo alone: each parent is still the same file (``lstat``: no byte of it read), each
signer is still accepted at its time by the restore's keyring (a key revoked, or no longer
anchored, since counts as it would in a full check), and each link is of the same run at an
earlier step. When any of that does not hold, the memo is not used for that walk and the
chain is checked in full, as before, with the same verdicts and messages: a removed,
altered or substituted manifest is reported exactly as it was. ``kaudit verify`` never
reads a memo; it checks every chain in full.

The memo cannot be forged by whoever can write the run's directory, the repository or the
remote: it lives in the key home (``$KAUDIT_HOME/chains/``, outside any repository, as the
user's own trust store does), and each line carries an HMAC-SHA256 of everything up to it
under a key derived from the run's private key and bound to the run's directory and id. A
line whose MAC does not hold ends the memo there (all after it is ignored). A file's
identity cannot be brought back once its bytes change without the privileges that could
read the private key itself: the change time (ctime) moves with every write, rename or
``utime`` and cannot be set by its owner. A memo that is missing, unreadable or from
another key just makes the walk a full one.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kronos_audit._internal.safeio import UnsafeFile, read_regular
from kronos_audit.keys.home import kaudit_home
from kronos_audit.statement.dsse import KeyId

log = logging.getLogger("kronos_audit.verification")

MEMO_DIR = "chains"
"""Where the memos are, in the key home."""
MEMO_LIMIT = 256 * 1024 * 1024
"""The largest memo read (about a million manifests); a larger one is not used."""
_VERSION = b"kaudit chain memo v1"
_SEP = "\t"

Identity = tuple[int, int, int, int, int]
"""A file's identity: device, inode, size, modification and change time (ns)."""


def identity(st: os.stat_result) -> Identity:
    """The identity of the file ``st`` describes."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class Entry:
    """One manifest the memo holds."""

    digest: str
    """Its sha256."""
    parent: str | None
    """Its parent's sha256 (None: the first of its chain)."""
    run: str
    """The run it signs."""
    step: int
    """The step it signs."""
    name: str
    """Where it is, relative to the run's directory (POSIX)."""
    file: Identity
    """The identity of that file when its bytes were read."""
    signers: tuple[KeyId, ...]
    """The keys whose signature on it verified."""
    created: str
    """The time it says it was signed."""

    def line(self) -> str:
        fields = (
            self.digest,
            self.parent or "-",
            self.run,
            str(self.step),
            self.name,
            ",".join(map(str, self.file)),
            ",".join(self.signers),
            self.created,
        )
        return _SEP.join(fields)

    @classmethod
    def parse(cls, line: str) -> Entry | None:
        fields = line.split(_SEP)
        if len(fields) != 8:
            return None
        digest, parent, run, step, name, file, signers, created = fields
        try:
            ident = tuple(int(x) for x in file.split(","))
            number = int(step)
        except ValueError:
            return None
        if len(ident) != 5:
            return None
        return cls(
            digest,
            None if parent == "-" else parent,
            run,
            number,
            name,
            (ident[0], ident[1], ident[2], ident[3], ident[4]),
            tuple(KeyId(k) for k in signers.split(",") if k),
            created,
        )


def _plain(entry: Entry) -> bool:
    """Whether ``entry``'s text fields fit on one line of the memo."""
    return not any(c in f for f in (entry.run, entry.name, entry.created) for c in "\t\n\r")


Accepts = Callable[[KeyId, str], bool]
"""Whether a signature by a key, at a time, counts (:meth:`Keyring.accepts
<kronos_audit.keys.anchors.Keyring.accepts>`)."""


class ChainMemo:
    """The memo of one run's chain, kept by its writer (see the module)."""

    def __init__(self, path: Path, secret: bytes, binding: bytes, directory: Path) -> None:
        self.path = path
        """The memo's file."""
        self.directory = directory
        """The run's directory (resolved): the entries' names are relative to it."""
        self._start = hmac.new(secret, _VERSION + b"\n" + binding, hashlib.sha256)
        self._mac = self._start.copy()
        self._entries: dict[str, Entry] = {}
        self._loaded = False
        self._broken = False  # a write failed: nothing more is written this time

    @classmethod
    def for_run(cls, private_raw: bytes, run_id: str, directory: Path) -> ChainMemo | None:
        """The memo of run ``run_id`` in ``directory`` under the private key whose raw
        bytes are ``private_raw`` (None where there is no key home to keep it in)."""
        try:
            home = kaudit_home()
            resolved = directory.resolve()
        except Exception as e:  # no key home: no memo, and every walk a full one
            log.debug("no chain memo: %s", e)
            return None
        binding = b"\0".join((os.fsencode(resolved), run_id.encode("utf-8", "surrogatepass")))
        public = hashlib.sha256(_VERSION + b"public" + private_raw).digest()
        name = hashlib.sha256(public + b"\0" + binding).hexdigest()[:40]
        secret = hashlib.sha256(_VERSION + b"secret" + private_raw).digest()
        return cls(home / MEMO_DIR / f"{name}.memo", secret, binding, resolved)

    # -- reading --------------------------------------------------------------------------

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        try:
            data = read_regular(self.path, MEMO_LIMIT, follow_symlinks=False)
        except UnsafeFile as e:
            if not e.missing:
                log.debug("chain memo not used: %s", e)
            return
        text = data.decode("utf-8", "replace")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        kept = 0
        for i, line in enumerate(lines):
            body, _, mac = line.rpartition(_SEP)
            self._mac.update(body.encode("utf-8", "surrogatepass") + b"\n")
            if i >= len(lines) - 2 or i % 1024 == 1023:
                # One MAC runs through every line: checked at the end, and now and then
                # so that a line cut short by a crash loses little of what is before it.
                if not hmac.compare_digest(self._mac.copy().hexdigest(), mac):
                    break
                kept = i + 1
        if kept < len(lines):
            log.debug("chain memo %s: ends at line %d (its MAC does not hold)", self.path, kept)
            self._entries = {}
            self._rewrite([Entry.parse(line.rpartition(_SEP)[0]) for line in lines[:kept]])
            return
        for line in lines:
            entry = Entry.parse(line.rpartition(_SEP)[0])
            if entry is not None:
                self._entries[entry.digest] = entry

    def knows(self, digest: str) -> bool:
        """Whether the memo holds the manifest whose sha256 is ``digest``."""
        self._load()
        return digest in self._entries

    def chain(self, digest: str, accepts: Accepts) -> tuple[int, int] | None:
        """For a manifest the memo holds (``digest``): the length of its chain and the
        step of its first manifest, when every parent below it is still the file it was
        (same identity, at the same name), signed by a key ``accepts`` takes at its time,
        of the same run at an earlier step, back to the first; else None (then the chain
        must be checked in full)."""
        self._load()
        entry = self._entries.get(digest)
        if entry is None:
            return None
        length = 1
        while entry.parent is not None:
            parent = self._entries.get(entry.parent)
            if parent is None or parent.run != entry.run or parent.step >= entry.step:
                return None
            try:
                st = os.lstat(self.directory / parent.name)
            except OSError:
                return None
            if not stat.S_ISREG(st.st_mode) or identity(st) != parent.file:
                return None
            if not any(accepts(k, parent.created) for k in parent.signers):
                return None
            entry = parent
            length += 1
        return length, entry.step

    # -- writing --------------------------------------------------------------------------

    def name_of(self, path: Path) -> str | None:
        """``path`` relative to the run's directory, if it is inside it."""
        try:
            return (path.parent.resolve() / path.name).relative_to(self.directory).as_posix()
        except (OSError, ValueError):
            return None

    def remember(self, entries: Iterable[Entry]) -> None:
        """Add ``entries`` to the memo (one it holds as another file: again, the later line
        standing). A memo that cannot be written is given up for this process: only a walk
        is lost."""
        self._load()
        new = [e for e in entries if self._entries.get(e.digest) != e and _plain(e)]
        if not new or self._broken:
            return
        lines = []
        for entry in new:
            body = entry.line()
            self._mac.update(body.encode("utf-8", "surrogatepass") + b"\n")
            lines.append(f"{body}{_SEP}{self._mac.copy().hexdigest()}\n")
            self._entries[entry.digest] = entry
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(self.path, flags, 0o600)
            try:
                os.write(fd, "".join(lines).encode("utf-8", "surrogatepass"))
            finally:
                os.close(fd)
        except OSError as e:
            log.debug("chain memo %s not written: %s", self.path, e)
            self._broken = True

    def _rewrite(self, entries: list[Entry | None]) -> None:
        """Start the memo again with ``entries`` (a memo whose end did not hold)."""
        try:
            self.path.unlink(missing_ok=True)
        except OSError as e:
            log.debug("chain memo %s not removed: %s", self.path, e)
            self._broken = True
            return
        self._mac = self._start.copy()
        self._entries = {}
        self.remember(e for e in entries if e is not None)


__all__ = ["MEMO_DIR", "ChainMemo", "Entry", "Identity", "identity"]
