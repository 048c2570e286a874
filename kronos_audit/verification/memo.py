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
the memo and one listing of the run's directory: each parent is still there, under its
name, as the same file (its inode, as the listing gives it: no file of the chain is read
or stat'ed), each signer is still accepted at its time by the restore's keyring (a key
revoked, or no longer anchored, since counts as it would in a full check), and each link
is of the same run at an earlier step. When any of that does not hold, the memo is not
used for that walk and the chain is checked in full, as before, with the same verdicts and
messages: a removed manifest, or one replaced by another file, is reported exactly as it
was. A manifest rewritten in place (the same file, other bytes) is not noticed by a
restore the memo answers; ``kaudit verify``, which never reads a memo and checks every
chain in full, reports it.

The memo cannot be forged by whoever can write the run's directory, the repository or the
remote: it lives in the key home (``$KAUDIT_HOME/chains/``, outside any repository, as the
user's own trust store does), and each line carries an HMAC-SHA256 of everything up to it
under a key derived from the run's private key and bound to the run's directory and id. A
line whose MAC does not hold ends the memo there (all after it is ignored). A memo that is
missing, unreadable or from another key just makes the walk a full one.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kronos_audit._internal.safeio import UnsafeFile, read_regular
from kronos_audit.checkpoint.layout import MANIFEST_SUFFIX
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

    def fields(self) -> list[str]:
        """Its fields as a line of the memo holds them."""
        return [
            self.digest,
            self.parent or "-",
            self.run,
            str(self.step),
            self.name,
            ",".join(map(str, self.file)),
            ",".join(self.signers),
            self.created,
        ]

    def line(self) -> str:
        return _SEP.join(self.fields())

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


def _step(text: str) -> int | None:
    return int(text) if text.isdigit() and len(text) <= 19 else None


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
        self._lines: dict[str, list[str]] = {}  # by digest: the fields of its latest line
        self._loaded = False
        self._broken = False  # a write failed: nothing more is written this time
        # The loop thread restores while the writer thread may be remembering a commit.
        self._lock = threading.RLock()

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
            self._rewrite([Entry.parse(line.rpartition(_SEP)[0]) for line in lines[:kept]])
            return
        for line in lines:
            fields = line.rpartition(_SEP)[0].split(_SEP)
            if len(fields) == 8:
                self._lines[fields[0]] = fields

    def knows(self, digest: str) -> bool:
        """Whether the memo holds the manifest whose sha256 is ``digest``."""
        with self._lock:
            self._load()
            return digest in self._lines

    def chain(self, digest: str, accepts: Accepts) -> tuple[int, int] | None:
        """For a manifest the memo holds (``digest``): the length of its chain and the
        step of its first manifest, when every parent below it is still the file it was
        (same identity, at the same name), signed by a key ``accepts`` takes at its time,
        of the same run at an earlier step, back to the first; else None (then the chain
        must be checked in full)."""
        with self._lock:
            self._load()
            lines = self._lines
        fields = lines.get(digest)
        if fields is None:
            return None
        # A run of thousands of steps walks thousands of lines: plain strings, and one
        # listing of the run's directory for all of them (a stat each would cost more than
        # the rest of a restore together).
        listed = self._listing()
        length = 1
        run, step = fields[2], _step(fields[3])
        parent_digest = fields[1]
        while parent_digest != "-":
            parent = lines.get(parent_digest)
            if parent is None or parent[2] != run:
                return None
            parent_step = _step(parent[3])
            if parent_step is None or step is None or parent_step >= step:
                return None
            inode = listed.get(parent[4]) if "/" not in parent[4] else self._inode(parent[4])
            if inode is None or str(inode) != parent[5].split(",")[1]:
                return None
            created = parent[7]
            if not any(accepts(KeyId(k), created) for k in parent[6].split(",") if k):
                return None
            parent_digest, step = parent[1], parent_step
            length += 1
        assert step is not None
        return length, step

    def _listing(self) -> dict[str, int]:
        """The manifests in the run's directory (its own, not its step directories'): by
        name, the inode each name is of (read from the listing: no file is stat'ed)."""
        try:
            with os.scandir(self.directory) as it:
                return {
                    e.name: e.inode()
                    for e in it
                    if e.name.endswith(MANIFEST_SUFFIX) and e.is_file(follow_symlinks=False)
                }
        except OSError:
            return {}

    def _inode(self, name: str) -> int | None:
        """The inode of the regular file ``name`` (in a step directory), if it is one."""
        try:
            st = os.lstat(self.directory / name)
        except OSError:
            return None
        return st.st_ino if stat.S_ISREG(st.st_mode) else None

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
        with self._lock:
            self._add(entries)

    def _add(self, entries: Iterable[Entry]) -> None:
        self._load()
        new = [e for e in entries if self._lines.get(e.digest) != e.fields() and _plain(e)]
        if not new or self._broken:
            return
        lines = []
        for entry in new:
            body = entry.line()
            self._mac.update(body.encode("utf-8", "surrogatepass") + b"\n")
            lines.append(f"{body}{_SEP}{self._mac.copy().hexdigest()}\n")
            self._lines[entry.digest] = entry.fields()
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
        self._lines = {}
        self._add(e for e in entries if e is not None)


__all__ = ["MEMO_DIR", "ChainMemo", "Entry", "Identity", "identity"]
