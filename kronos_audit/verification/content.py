"""(4) The content of a single-file checkpoint, against what its manifest signs: in this
process, or on worker processes ahead of the verifier that reports it.

A run of thousands of checkpoints is verified on every core: while the verifier reads
each manifest, checks its signature, its place and its link, the checkpoints it will
come to are checked by :class:`Ahead`'s workers, each exactly as :func:`check_file`
checks it here (the same function, given the same signed values), and the verifier takes
the worker's checks when it reaches that step; a verifier that would wait for them
checks files no worker has taken yet itself, so both sides work to the end. Nothing is
remembered between two verifications, and nothing is read from the run directory but the
checkpoint itself: a worker's answer is a check made now, of the file as it is now, never
a record anyone could have written. A file a worker could not judge (it raised: not
there, unreadable) is checked again in the verifier, which says why as it always did.
"""

from __future__ import annotations

import collections
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from kronos_audit.checkpoint.formats.registry import diagnose_signed, digest_signed
from kronos_audit.checkpoint.hashing import DatasetDigest, open_file
from kronos_audit.checkpoint.opened import SMALL_PRIVATE
from kronos_audit.errors import CheckpointError
from kronos_audit.verification import steps
from kronos_audit.verification.results import Check, CheckName, CheckStatus

if TYPE_CHECKING:
    from kronos_audit.statement.manifest import Manifest

DIAGNOSE_SLACK = 64 * 1024 * 1024
"""A checkpoint of another size than the signed one is never hashed; one larger than
twice its signed size plus this is not parsed either (no dataset diagnostic)."""
AHEAD_MIN = 256
"""Fewest checkpoint files a verification must check before worker processes check
them ahead: below it, starting the workers costs more than they save."""
CHUNK = 32
"""Files handed to a worker at once, and answered at once: few enough messages (each
costs a wake-up of a thread of the verifier's process), and the first answers soon."""


@dataclass(frozen=True)
class SignedFile:
    """What a manifest signs of its checkpoint file: all a check of its content reads."""

    path: Path
    """The checkpoint file, where the manifest is."""
    size: int
    """Its signed size in bytes."""
    sha256: str
    """Its signed sha256 (the subject digest)."""
    datasets: tuple[DatasetDigest, ...] | None
    """Its signed per-dataset digests, if any."""
    format: str | None
    """Its signed format (None: a manifest that predates formats)."""
    manifest: str = ""
    """The sha256 of the manifest that signs it: a worker's answer is taken only for the
    very manifest it was asked for."""

    @classmethod
    def of(cls, manifest: Manifest) -> SignedFile:
        record = manifest.record
        return cls(
            manifest.checkpoint_path,
            record.size,
            manifest.subject_sha256,
            manifest.datasets,
            record.format,
            manifest.digest,
        )


def check_file(signed: SignedFile) -> list[Check]:
    """(4) The file checks, in the order that keeps hostile content unparsed: the size
    (a file of another size is not read at all), then the sha256 of the bytes, and
    only then HDF5: all of it when the digest is the signed one, or, for a bounded
    diagnostic of which datasets changed, only datasets whose signed dtype and shape
    they still have (:func:`~kronos_audit.checkpoint.hashing.digest_open`). A small file
    is read once into private memory, and hashed and parsed from that copy."""
    checkpoint = signed.path
    try:
        st = os.stat(checkpoint)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint: {e.strerror}", path=checkpoint) from None
    if not stat.S_ISREG(st.st_mode):
        return [Check.failed(CheckName.FILE_DIGEST, "the checkpoint is not a regular file")]
    # Everything below reads the one descriptor opened here, whatever the name holds.
    with open_file(checkpoint) as opened:
        if opened.size != signed.size:
            # Not hashed: no digest of other bytes can match. Which datasets changed
            # is still said, within the signed datasets' bound, unless the file is
            # far larger than what was signed (then nothing of it is read).
            checks = [steps.size_refused(opened.size, signed.size)]
            if opened.size > 2 * signed.size + DIAGNOSE_SLACK:
                return checks
            found, unreadable = diagnose_signed(opened, signed.format, signed.datasets or ())
        else:
            if opened.size <= SMALL_PRIVATE:
                opened.read_private(progress=False)  # one read; hashed and parsed from it
            # Read as the signed format says, never as the file now looks.
            digests = digest_signed(
                opened,
                signed.format,
                expect_sha256=signed.sha256,
                recorded=signed.datasets,
            )
            found, unreadable = digests.datasets, digests.unreadable
            checks = [steps.file_digest(digests.sha256, signed.sha256)]
    return checks + steps.datasets(signed.datasets, signed.format, found, unreadable)


def _digest_json(d: DatasetDigest) -> list[Any]:
    attributes = None if d.attributes is None else [_digest_json(a) for a in d.attributes]
    shape = None if d.shape is None else list(d.shape)
    extent = None if d.extent is None else list(d.extent)
    return [d.path, d.dtype, shape, d.sha256, extent, attributes]


def _digest_of(obj: list[Any]) -> DatasetDigest:
    path, dtype, shape, sha256, extent, attributes = obj
    return DatasetDigest(
        path,
        dtype,
        None if shape is None else tuple(shape),
        sha256,
        extent=None if extent is None else (extent[0], extent[1]),
        attributes=None if attributes is None else tuple(_digest_of(a) for a in attributes),
    )


def _signed_json(signed: SignedFile) -> list[Any]:
    datasets = None if signed.datasets is None else [_digest_json(d) for d in signed.datasets]
    path = str(signed.path.absolute())
    return [path, signed.size, signed.sha256, datasets, signed.format, signed.manifest]


def _signed_of(obj: list[Any]) -> SignedFile:
    path, size, sha256, datasets, fmt, manifest = obj
    return SignedFile(
        Path(path),
        size,
        sha256,
        None if datasets is None else tuple(_digest_of(d) for d in datasets),
        fmt,
        manifest,
    )


def _check_json(c: Check) -> list[Any]:
    return [c.kind.value, c.status.value, c.detail, c.dataset, c.pruned]


_CHECKS_KEPT = 1024
_checks: dict[tuple[Any, ...], Check] = {}
"""Checks as answered, by their values: a run's answers repeat a few (frozen, so
shared)."""


def _check_of(obj: list[Any]) -> Check:
    key = tuple(obj)
    known = _checks.get(key)
    if known is None:
        kind, status, detail, dataset, pruned = obj
        known = Check(CheckName(kind), CheckStatus(status), detail, dataset=dataset, pruned=pruned)
        if len(_checks) < _CHECKS_KEPT:
            _checks[key] = known
    return known


def serve(requests: IO[bytes], answers: IO[str]) -> None:
    """A worker: for each request line (a chunk of ``[i, signed file]``), one answer line
    of ``[i, checks]``, the checks None when :func:`check_file` raised (the verifier
    checks that file again itself, to say why in its own words)."""
    for line in requests:
        made = []
        for i, obj in json.loads(line):
            try:
                checks: list[list[Any]] | None = [
                    _check_json(c) for c in check_file(_signed_of(obj))
                ]
            except Exception:
                checks = None
            made.append([i, checks])
        answers.write(json.dumps(made) + "\n")
        answers.flush()


Worker = subprocess.Popen[bytes]
Chunk = list[tuple[int, SignedFile]]

IN_FLIGHT = 2
"""Chunks handed to a worker and not yet answered: one to check while the next waits in
the pipe. The others wait in this process, where the verifier may take them (see
:meth:`Ahead.take`)."""


class Ahead:
    """Checkpoint files checked by ``workers`` processes ahead of the verifier: hand it
    the files in the order they will be asked for (:meth:`submit`), ask for each
    (:meth:`take`), :meth:`close` it.

    Each worker is a fresh interpreter running this module (nothing of this process is
    copied into it, and the program's own main module is never imported again), fed
    chunks by a thread of this process and read by another, so that neither side ever
    waits on a full pipe. The chunks wait here until a worker has fewer than
    :data:`IN_FLIGHT`; a verifier that would wait for an answer checks a waiting chunk
    itself instead, so that every core works to the end whichever side is faster. A
    worker that dies leaves its files to the verifier."""

    def __init__(self, workers: int) -> None:
        package_root = str(Path(__file__).resolve().parents[2])  # where kronos_audit is
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self._cond = threading.Condition()
        self._answers: dict[int, list[Check] | None] = {}
        self._asked: dict[SignedFile, int] = {}
        self._waiting: collections.deque[Chunk] = collections.deque()
        self._sent: dict[int, int] = {}  # file -> the worker it went to
        self._in_flight: list[int] = []
        self._alive: list[bool] = []
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._procs: list[Worker] = []
        self._count = 0  # files numbered, whatever was taken since
        self.checked_here = 0
        """Files the verifier checked itself rather than wait for a worker."""
        for w in range(workers):
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", __name__],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    env=env,
                )
            except OSError:
                break  # no worker: the verifier checks what none takes
            self._procs.append(proc)
            self._alive.append(True)
            self._in_flight.append(0)
            for target in (self._feed, self._read):
                t = threading.Thread(
                    target=target, args=(w, proc), daemon=True, name="kaudit-ahead"
                )
                t.start()
                self._threads.append(t)

    def _feed(self, w: int, proc: Worker) -> None:
        assert proc.stdin is not None
        try:
            while True:
                with self._cond:
                    while (
                        not self._closing
                        and self._alive[w]
                        and (not self._waiting or self._in_flight[w] >= IN_FLIGHT)
                    ):
                        self._cond.wait()
                    if self._closing or not self._alive[w]:
                        break
                    chunk = self._waiting.popleft()
                    self._in_flight[w] += 1
                    for i, _ in chunk:
                        self._sent[i] = w
                line = json.dumps([[i, _signed_json(signed)] for i, signed in chunk]) + "\n"
                proc.stdin.write(line.encode())
                proc.stdin.flush()
            proc.stdin.close()
        except OSError:
            pass  # the worker is gone: its reader says so

    def _read(self, w: int, proc: Worker) -> None:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                made = {
                    i: None if checks is None else [_check_of(c) for c in checks]
                    for i, checks in json.loads(line)
                }
                with self._cond:
                    self._answers.update(made)
                    self._in_flight[w] -= 1
                    self._cond.notify_all()
        except (OSError, ValueError, TypeError, KeyError):
            pass
        finally:
            with self._cond:
                self._alive[w] = False
                self._cond.notify_all()

    def submit(self, files: Sequence[SignedFile]) -> None:
        """Have ``files`` checked (by the next worker free, or by the verifier)."""
        if not self._procs:
            return
        chunk: Chunk = []
        for signed in files:
            i = self._count
            self._count += 1
            self._asked[signed] = i
            chunk.append((i, signed))
        with self._cond:
            self._waiting.append(chunk)
            self._cond.notify_all()

    def take(self, signed: SignedFile) -> list[Check] | None:
        """The checks made of ``signed`` (once: a second ask is answered None), or None
        when none was asked for or its worker could not judge it. Rather than wait for a
        worker, the verifier checks a waiting chunk itself: this file's own, when no worker
        has it yet, else the one furthest ahead."""
        i = self._asked.pop(signed, None)
        if i is None:
            return None
        while True:
            with self._cond:
                while True:
                    if i in self._answers:
                        return self._answers.pop(i)
                    w = self._sent.get(i)
                    if w is not None and not self._alive[w]:
                        return None
                    if w is None or self._waiting:
                        break
                    self._cond.wait()
                if w is None:  # its chunk waits here still: among the first
                    found = next((c for c in self._waiting if c[0][0] <= i <= c[-1][0]), None)
                    if found is None:
                        return None  # dropped (closed): checked when it is reached
                    chunk = found
                    self._waiting.remove(chunk)
                else:
                    chunk = self._waiting.pop()
            self._check_here(chunk)

    def _check_here(self, chunk: Chunk) -> None:
        """The checks of ``chunk``, made in this process exactly as a worker makes them."""
        made: dict[int, list[Check] | None] = {}
        for i, signed in chunk:
            try:
                made[i] = check_file(signed)
            except Exception:
                made[i] = None  # checked again when it is reached, to say why
        with self._cond:
            self._answers.update(made)
        self.checked_here += len(chunk)

    def close(self) -> None:
        """Stop the workers; what they did not do is dropped."""
        self._asked.clear()
        with self._cond:
            self._closing = True
            self._waiting.clear()
            self._cond.notify_all()
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            proc.wait()
        for t in self._threads:
            t.join()
        for proc in self._procs:
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


__all__ = ["AHEAD_MIN", "Ahead", "SignedFile", "check_file", "serve"]

if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout)
