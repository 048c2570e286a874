"""The parent handed over to the command: a copy of the verified parent checkpoint and
its manifest (and the chunks of the ledger it names) in a fresh directory, checked
against the signed digests (:func:`hand_over`;
for a directory step, every file it lists: :func:`hand_over_directory`; for a sharded
step, its manifest, shard index and every shard: :func:`hand_over_step`).
The command never sees the run directory, where the recorded checkpoint it is compared
with lies beside the parent.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

from kronos_audit._internal.safeio import MANIFEST_LIMIT, UnsafeFile, read_regular
from kronos_audit.checkpoint.layout import INDEX_NAME, manifest_path_for
from kronos_audit.checkpoint.ledger import CHUNK_DIR, chunk_path, run_dir_of
from kronos_audit.checkpoint.shards import LINE_WIDTH, hash_shard, parse_index, read_index
from kronos_audit.errors import CheckpointError, ReplayError, Stage
from kronos_audit.statement.manifest import Manifest

PARENT_DIR = "parent"
"""The directory in the work directory that holds the copy of the parent handed over."""
_COPY_CHUNK = 1 << 30
_NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP})


def hand_over(parent: Manifest, dest: Path) -> Path:
    """Copy the verified parent checkpoint and its manifest (``Run`` reads the step there)
    into ``dest``, a new directory, keeping their names; return the checkpoint's copy.

    The command resumes from this copy, never from the repository: beside the parent in the
    run directory lies the recorded checkpoint the replay compares with, and a command that
    wrote to its input would alter verified history. The copy is a new file (the kernel may
    share blocks, a reflink, but never a hard or symbolic link), and the sha256 of what is
    handed over must be the signed one, so a file swapped during the copy is caught.
    """
    if parent.record.directory is not None:
        return hand_over_directory(parent, dest)
    checkpoint = dest / parent.checkpoint_path.name
    try:
        dest.mkdir(mode=0o700)
        _copy(parent.checkpoint_path, checkpoint, parent.record.size)
        with open(checkpoint, "rb") as f:
            copied = hashlib.file_digest(f, "sha256").hexdigest()
        if copied != parent.subject_sha256:
            raise _copy_refused(
                f"the parent checkpoint changed after it was verified: its copy's sha256 "
                f"{copied[:16]}... is not the signed {parent.subject_sha256[:16]}...",
                parent.checkpoint_path,
            )
        _copy_manifest(parent, manifest_path_for(checkpoint))
        _copy_chunks(parent, dest)
    except UnsafeFile as e:
        raise _copy_refused(
            f"cannot copy the parent manifest for the command: {e.reason}",
            parent.path,
        ) from None
    except OSError as e:
        raise _copy_refused(
            f"cannot copy the parent checkpoint for the command: {e.strerror or e}",
            parent.checkpoint_path,
        ) from None
    return checkpoint


def hand_over_directory(parent: Manifest, dest: Path, what: str = "the parent step") -> Path:
    """Copy the verified parent directory step (every file its manifest lists, and the
    manifest beside it) into ``dest/<its name>/``; return that directory. Each copy is a
    new read-only file checked against its signed size and sha256, so a file swapped after
    verification is caught; a file in the directory that the manifest does not list is
    not handed over (it was never verified). ``what`` names the step in a refusal (a
    replay also copies the recorded step so, to read exactly what was verified)."""
    record = parent.record.directory
    assert record is not None
    source = parent.checkpoint_path
    step_dir = dest / source.name
    try:
        dest.mkdir(mode=0o700)
        step_dir.mkdir(mode=0o700)
        for f in record.files:  # paths checked when the manifest was read: inside it
            copy = step_dir / f.path
            for d in reversed(copy.relative_to(step_dir).parents[:-1]):
                (step_dir / d).mkdir(mode=0o700, exist_ok=True)
            _copy(source / f.path, copy, f.size)
            with open(copy, "rb") as fin:
                copied = hashlib.file_digest(fin, "sha256").hexdigest()
            if copied != f.sha256:
                raise _copy_refused(
                    f"{f.path} of {what} changed after it was verified: its copy's "
                    f"sha256 {copied[:16]}... is not the signed {f.sha256[:16]}...",
                    source,
                )
        _copy_manifest(parent, manifest_path_for(step_dir))
    except UnsafeFile as e:
        raise _copy_refused(
            f"cannot copy the manifest of {what}: {e.reason}", parent.path
        ) from None
    except OSError as e:
        raise _copy_refused(f"cannot copy {what}: {e.strerror or e}", source) from None
    return step_dir


def hand_over_step(parent: Manifest, dest: Path) -> Path:
    """Copy the verified parent step (manifest, index, every shard) into
    ``dest/step-<N:08d>/``, and the chunks of the ledger it names into ``dest/ledger/``;
    return that step directory. Every copy is a new file checked against
    the signed digests (the manifest's own, the index's, each shard's on its index line),
    so a file swapped after verification is caught."""
    shards = parent.record.shards
    if shards is None:
        raise _copy_refused(
            "the parent of a sharded step is a checkpoint in one file: a replay on several "
            "ranks resumes from a sharded step only",
            parent.path,
        )
    step_dir = dest / parent.checkpoint_path.parent.name
    index = step_dir / INDEX_NAME
    try:
        dest.mkdir(mode=0o700)
        step_dir.mkdir(mode=0o700)
        _copy(parent.checkpoint_path, index, shards.count * LINE_WIDTH)
        data = read_index(index, shards.count)
        if hashlib.sha256(data).hexdigest() != parent.subject_sha256:
            raise _copy_refused(
                "the parent step's shard index changed after it was verified",
                parent.checkpoint_path,
            )
        records = parse_index(data, shards.count, index)
        for record in records:
            copy = step_dir / record.name
            _copy(parent.checkpoint_path.parent / record.name, copy, record.size)
            problem, sha = hash_shard(str(copy), record.size)
            if problem is not None or sha != record.sha256:
                raise _copy_refused(
                    f"the parent step's shard of rank {record.rank} changed after it was verified",
                    parent.checkpoint_path.parent / record.name,
                )
        _copy_manifest(parent, step_dir / parent.path.name)
        _copy_chunks(parent, dest)
    except UnsafeFile as e:
        raise _copy_refused(
            f"cannot copy the parent step for the command: {e.reason}",
            parent.path,
        ) from None
    except CheckpointError as e:
        raise _copy_refused(
            f"cannot copy the parent step for the command: {e.message}",
            parent.checkpoint_path.parent,
        ) from None
    except OSError as e:
        raise _copy_refused(
            f"cannot copy the parent step for the command: {e.strerror or e}",
            parent.checkpoint_path.parent,
        ) from None
    return step_dir


def _copy_chunks(parent: Manifest, dest: Path) -> None:
    """The chunks of the ledger the parent manifest names, copied into ``dest``'s own
    ``ledger/`` directory, each copy's sha256 the signed one (the command restores the
    ledger from them)."""
    if not parent.record.ledger:
        return
    (dest / CHUNK_DIR).mkdir(mode=0o700)
    run_dir = run_dir_of(parent.checkpoint_path, sharded=parent.record.shards is not None)
    for chunk in parent.record.ledger:
        source = chunk_path(run_dir, chunk.sha256)
        copy = chunk_path(dest, chunk.sha256)
        _copy(source, copy, chunk.size)
        with open(copy, "rb") as f:
            copied = hashlib.file_digest(f, "sha256").hexdigest()
        if copied != chunk.sha256:
            raise _copy_refused(
                f"a chunk of the parent's ledger is not the signed one: its copy's sha256 "
                f"is {copied[:16]}...",
                source,
            )


def _copy_manifest(parent: Manifest, dest: Path) -> None:
    """A new read-only ``dest`` holding the parent manifest's bytes, if they are the
    verified ones."""
    data = read_regular(parent.path, MANIFEST_LIMIT)
    if hashlib.sha256(data).hexdigest() != parent.digest:
        raise _copy_refused("the parent manifest changed after it was verified", parent.path)
    _write_new(dest, data)


def _copy_refused(message: str, path: Path) -> ReplayError:
    """The refusal of a parent that cannot be handed over (not copied, or its copy is not
    what was verified): the replay stops at the data stage."""
    return ReplayError(message, path=path, stage=Stage.DATA)


def _copy(src: Path, dst: Path, size: int) -> None:
    """A new read-only file ``dst`` holding the bytes of the regular file ``src``, which
    must be ``size`` bytes (the signed size, or an index's for its shard count): a file of
    another size is refused before a byte is copied, and no more than ``size`` bytes are
    ever copied (a file that grows while it is read fills no disk; its copy fails the
    digest check).
    A checkpoint that is DVC's link into its cache is read where it points."""
    fin = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO cannot block
    try:
        st = os.fstat(fin)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if st.st_size != size:
            raise OSError(errno.EFBIG, f"is {st.st_size:,} bytes, not the {size:,} signed")
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            _copy_bytes(fin, fout, st.st_size)
            os.fchmod(fout, 0o400)  # an input, not a scratch file
        finally:
            os.close(fout)
    finally:
        os.close(fin)


def _copy_bytes(fin: int, fout: int, size: int) -> None:
    """Copy at most ``size`` bytes from the start of ``fin`` to ``fout``."""
    try:  # in the kernel: no round trip through user memory, and a reflink where it can
        done = 0
        while done < size:
            n = os.copy_file_range(fin, fout, min(_COPY_CHUNK, size - done))
            if n == 0:
                break
            done += n
        return
    except OSError as e:
        if e.errno not in _NO_KERNEL_COPY:
            raise
    os.lseek(fin, 0, os.SEEK_SET)
    os.lseek(fout, 0, os.SEEK_SET)
    os.ftruncate(fout, 0)
    left = size
    while left > 0:
        chunk = os.read(fin, min(left, 8 * 1024 * 1024))
        if not chunk:
            break
        view = memoryview(chunk)
        while view:
            view = view[os.write(fout, view) :]
        left -= len(chunk)


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
    with open(fd, "wb") as f:
        f.write(data)
