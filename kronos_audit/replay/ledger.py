"""A replayed step's chunk of the Monte Carlo ledger against the recorded step's.

A run keeps its ledger in chunks beside its steps (:mod:`kronos_audit.checkpoint.ledger`):
step N's manifest names its parent's chunks and the one step N wrote, of the batches
recorded since. The replayed program restores the parent's (handed over with it), writes
its own chunk of step N into the replay's directory and lists every chunk of its ledger
in :data:`~kronos_audit.supervise.protocol.LEDGER_FILE`. :func:`compare_ledger` compares
the two lists past the chunks they share (the parent's): each chunk bitwise, by the
sha256 of its bytes and the rows it holds, so a result that was changed and signed again
is caught by a replay as it is by nothing else. One result, at the path ``/ledger``, for
each chunk either step wrote; when the recorded chunk is here, a difference names the
datasets (``/ledger/index``, ``/ledger/results/...``) that differ.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

from kronos_audit._internal import strictjson
from kronos_audit._internal.safeio import UnsafeFile, read_regular
from kronos_audit.checkpoint.formats import digest_file
from kronos_audit.checkpoint.hashing import DatasetDigest
from kronos_audit.checkpoint.ledger import (
    CHUNK_BYTES_LIMIT,
    CHUNKS_LIMIT,
    LedgerChunk,
    chunk_path,
    chunks_problem,
    ledger_rows,
    run_dir_of,
)
from kronos_audit.compare import Verdict
from kronos_audit.errors import CheckpointError, ReplayError, Stage
from kronos_audit.replay.interface import DatasetReplay
from kronos_audit.statement.manifest import Manifest
from kronos_audit.supervise.protocol import LEDGER_FILE, LEDGER_IN_FILE

LEDGER_PATH = "/ledger"
"""The path a chunk's result is given (its datasets are under it in the chunk)."""
CHUNK_DTYPE = "ledger-chunk"
"""What a chunk's identity names in place of a dtype: its digest is the file's sha256."""
LEDGER_FILE_LIMIT = 1 << 20
"""Bytes of :data:`~kronos_audit.supervise.protocol.LEDGER_FILE` read: some 200 bytes a
chunk, at most :data:`~kronos_audit.checkpoint.ledger.CHUNKS_LIMIT` of them."""
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MD5 = re.compile(r"[0-9a-f]{32}")


def replayed_chunks(out: Path) -> tuple[LedgerChunk, ...] | None:
    """The chunks of step N's ledger the replayed program listed in ``out`` (None: it
    listed none, as a program that keeps no ledger in chunks). ReplayError (stage
    ``output``) for a list that is not one: too large, not JSON, a chunk malformed, named
    twice or out of order."""
    path = out / LEDGER_FILE
    try:
        data = read_regular(path, LEDGER_FILE_LIMIT, follow_symlinks=False)
    except UnsafeFile as e:
        if e.missing:
            return None
        raise _bad(f"{e.reason}", path) from None
    try:
        listed = strictjson.loads(data.decode("utf-8"))["ledger"]
        if not isinstance(listed, list) or len(listed) > CHUNKS_LIMIT:
            raise ValueError("not a list of chunks")
        chunks = tuple(_chunk(obj) for obj in listed)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise _bad("is not a list of the ledger's chunks", path) from None
    problem = chunks_problem(chunks)
    if problem is not None:
        raise _bad(problem, path)
    return chunks


def _chunk(obj: object) -> LedgerChunk:
    if not isinstance(obj, dict) or set(obj) != {"sha256", "md5", "size", "first", "count"}:
        raise ValueError("not a chunk")
    numbers = [obj[k] for k in ("size", "first", "count")]
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in numbers):
        raise ValueError("not a chunk")
    sha256, md5 = obj["sha256"], obj["md5"]
    if not (isinstance(sha256, str) and _SHA256.fullmatch(sha256)):
        raise ValueError("not a chunk")
    if not (isinstance(md5, str) and _MD5.fullmatch(md5)):
        raise ValueError("not a chunk")
    return LedgerChunk.from_json_obj(obj)


def _bad(why: str, path: Path) -> ReplayError:
    return ReplayError(
        f"the ledger the replayed program listed ({LEDGER_FILE}) {why}",
        path=path,
        stage=Stage.OUTPUT,
    )


def compare_ledger(m: Manifest, out: Path) -> list[DatasetReplay]:
    """One result (path ``/ledger``) for each chunk of its ledger the recorded step ``m``
    or the step the replay wrote into ``out`` has that the other has not, past the chunks
    both name (the parent's, handed over): IDENTICAL when the two steps' new chunks are
    the same bytes holding the same rows, DIFFERENT when not (ONLY_IN_A, ONLY_IN_B when one
    step wrote a chunk the other did not). Nothing when neither step names a chunk, or the
    replayed program listed none and the recorded step names none."""
    recorded = m.record.ledger
    replayed = replayed_chunks(out)
    if replayed is None:
        if not recorded:
            return []
        replayed = ()
    shared = 0
    while shared < min(len(recorded), len(replayed)) and recorded[shared] == replayed[shared]:
        shared += 1
    mine, theirs = recorded[shared:], replayed[shared:]
    if not mine and not theirs:
        if not recorded:
            return []
        # Step N wrote no chunk of its own (no batch since its parent): the same ledger.
        last = recorded[-1]
        return [DatasetReplay(LEDGER_PATH, Verdict.IDENTICAL, _digest(last), _digest(last))]
    run_dir = run_dir_of(m.checkpoint_path, sharded=m.record.shards is not None)
    results = []
    for k in range(max(len(mine), len(theirs))):
        a = mine[k] if k < len(mine) else None
        b = theirs[k] if k < len(theirs) else None
        results.append(_one(a, b, run_dir, out))
    return results


def _one(a: LedgerChunk | None, b: LedgerChunk | None, run_dir: Path, out: Path) -> DatasetReplay:
    da = None if a is None else _digest(a)
    db = None if b is None else _digest(b)
    if a is None:
        assert b is not None
        return DatasetReplay(
            LEDGER_PATH,
            Verdict.ONLY_IN_B,
            None,
            db,
            f"the replay wrote a chunk of the ledger ({_rows(b)}) the recorded step has not",
        )
    if b is None:
        return DatasetReplay(
            LEDGER_PATH,
            Verdict.ONLY_IN_A,
            da,
            None,
            f"the replay wrote no chunk of the ledger's {_rows(a)}, which the recorded step has",
        )
    if a == b:
        return DatasetReplay(LEDGER_PATH, Verdict.IDENTICAL, da, db)
    detail = (
        f"the ledger's chunk of {_rows(a)} (sha256 {a.sha256[:16]}...) is not the replay's "
        f"chunk of {_rows(b)} (sha256 {b.sha256[:16]}...)"
    )
    which = _datasets_differing(chunk_path(run_dir, a.sha256), a, chunk_path(out, b.sha256), b)
    if which:
        detail += f": {', '.join(which)} differ{'s' if len(which) == 1 else ''}"
    return DatasetReplay(LEDGER_PATH, Verdict.DIFFERENT, da, db, detail)


def _digest(chunk: LedgerChunk) -> DatasetDigest:
    return DatasetDigest(LEDGER_PATH, CHUNK_DTYPE, (chunk.count,), chunk.sha256)


def _rows(chunk: LedgerChunk) -> str:
    return f"rows {chunk.first} to {chunk.first + chunk.count - 1}"


def _datasets_differing(
    recorded: Path, a: LedgerChunk, replayed: Path, b: LedgerChunk
) -> Sequence[str]:
    """The datasets of the two chunks whose canonical digests differ (only in one counts),
    when both files are here as the bytes their lists name; none otherwise (the chunk's
    digest alone says that it differs). A file is read only when it is a regular file
    (never a link) of the size its list names."""
    if not (_plain(recorded, a.size) and _plain(replayed, b.size)):
        return ()
    try:
        da, db = digest_file(recorded), digest_file(replayed)
    except (CheckpointError, OSError):
        return ()
    if da.sha256 != a.sha256 or db.sha256 != b.sha256 or da.datasets is None:
        return ()
    if db.datasets is None:
        return ()
    left = {d.path: d for d in da.datasets}
    right = {d.path: d for d in db.datasets}
    return sorted(p for p in left.keys() | right.keys() if left.get(p) != right.get(p))


def ledger_from(m: Manifest, parent: Manifest | None) -> int | None:
    """Where the recorded step ``m`` (whose parent is ``parent``) keeps its ledger, for the
    replayed program to keep step N's alike
    (:attr:`~kronos_audit.supervise.protocol.ReplayInstruction.ledger_from`): the row its
    own chunk starts at (the ledger's rows when it wrote none: its last chunk is its
    parent's), :data:`~kronos_audit.supervise.protocol.LEDGER_IN_FILE` for a step file
    holding ``/ledger``, None when it says neither. So the replay writes the chunk the
    run wrote, also where the run wrote its ledger whole again (after its chunk limit, or
    a restore from a level) or for the first time in chunks (its parent held it)."""
    recorded = m.record.ledger
    if not recorded:
        held = m.datasets is not None and any(d.path == "/ledger/index" for d in m.datasets)
        return LEDGER_IN_FILE if held else None
    before = () if parent is None else parent.record.ledger
    return ledger_rows(recorded) if recorded[-1] in before else recorded[-1].first


def _plain(path: Path, size: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == size <= CHUNK_BYTES_LIMIT


__all__ = ["LEDGER_PATH", "compare_ledger", "ledger_from", "replayed_chunks"]
