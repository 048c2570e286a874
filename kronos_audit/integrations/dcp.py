"""kaudit inside ``torch.distributed.checkpoint``: a storage writer that signs each save as
a step of a run, and a storage reader that verifies before DCP unpickles or loads a byte.

::

    import torch.distributed.checkpoint as dcp
    from kronos_audit.integrations.dcp import SignedWriter, VerifiedReader

    dcp.save(state, storage_writer=SignedWriter("ckpt/step-100", run="llm", step=100))
    dcp.load(state, storage_reader=VerifiedReader("ckpt/step-100"))

The directory holds DCP's own format, unchanged: ``dcp.load`` with a plain
``FileSystemReader`` reads it as before. :class:`SignedWriter` is DCP's
``FileSystemWriter`` with every file hashed from memory as it is written (each item's sha256,
each file's sha256 and md5: :mod:`kronos_audit.integrations._dcp_digests`); each rank sends
its digests to the coordinator with its write results, and the coordinator's ``finish``
writes ``.metadata`` (hashed the same way) and signs the step over every rank's files.

:class:`VerifiedReader` is DCP's ``FileSystemReader`` that checks ``.metadata``'s bytes
against their signed digest before it unpickles them (and then only DCP's metadata classes),
and reads each item into memory through one descriptor, checks its sha256 and only then
hands those same bytes to DCP's ``load_bytes`` or ``torch.load``. A changed byte fails the
load naming the tensor. A step saved on N ranks loads on any number.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import (
    FileSystemReader,
    FileSystemWriter,
    _StorageInfo,
)
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from kronos_audit._internal.safeio import UnsafeFile, read_regular
from kronos_audit.checkpoint.directory import FileEntry, ItemDigest
from kronos_audit.checkpoint.layout import manifest_path_for
from kronos_audit.errors import CheckpointError, TamperedData, UsageError
from kronos_audit.integrations._common import previous_manifest, verified_signature
from kronos_audit.integrations._dcp_digests import (
    DigestingFileSystem,
    FileRecord,
    ItemRecord,
    SaveDigests,
    Written,
    load_metadata,
)
from kronos_audit.keys.anchors import TrustOptions
from kronos_audit.signing.snapshot import snapshot
from kronos_audit.statement.manifest import Manifest

METADATA = ".metadata"
"""The name of DCP's metadata file."""
METADATA_LIMIT = 1 << 30
"""Largest ``.metadata`` read (it grows with the number of tensor chunks)."""
_DIGESTS = "\x00kaudit-digests"
"""The name of the write result each rank adds for the coordinator: its digests. No state
dict key starts with a NUL, and ``finish`` takes these out before DCP sees the results."""


@dataclass(frozen=True)
class _RankDigests:
    """What one rank hashed in ``write_data``: sent to the coordinator in its results."""

    rank: int
    files: tuple[Written, ...]


class SignedWriter(FileSystemWriter):
    """DCP's ``FileSystemWriter`` that hashes what it writes and signs each save as step
    ``step`` of run ``run``.

    ``parent`` is the previous step's manifest (None: the newest step of the run beside
    it, if it has one). ``seeds``, ``attributes`` and ``key`` are those of
    :func:`kronos_audit.snapshot`. With ``tensors`` (the default) the coordinator also reads
    the saved tensors back by global name for the manifest (what ``kaudit diff`` and replay
    compare DCP steps by, whatever the world size); ``tensors=False`` spares that second
    pass over the data, and a comparison of the step then goes by its files.
    The save refuses a directory that already holds a signed step; the files of an
    unfinished save there (DCP's names only) are replaced. Every rank must use a
    SignedWriter, with collectives (``use_collectives=True``, DCP's default).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        run: str,
        step: int,
        parent: str | os.PathLike[str] | None = None,
        seeds: Sequence[int] = (),
        attributes: Mapping[str, Any] | None = None,
        key: str | None = None,
        thread_count: int = 1,
        sync_files: bool = True,
        single_file_per_rank: bool = True,
        per_thread_copy_ahead: int = 10_000_000,
        tensors: bool = True,
    ) -> None:
        if not run:
            raise UsageError("the run id must not be empty")
        if step < 0:
            raise UsageError(f"step must be >= 0, got {step}")
        super().__init__(
            path,
            single_file_per_rank=single_file_per_rank,
            sync_files=sync_files,
            thread_count=thread_count,
            per_thread_copy_ahead=per_thread_copy_ahead,
            overwrite=True,  # checked here instead (prepare_global_plan), without a warning
        )
        self.hashing = DigestingFileSystem()
        self.fs = self.hashing
        self.run = run
        self.step = step
        self.parent = None if parent is None else Path(parent)
        self.seeds = tuple(seeds)
        self.attributes = dict(attributes or {})
        self.key = key
        self.tensors = tensors
        self.digests: SaveDigests | None = None
        """What the last save hashed (on the coordinator, once ``finish`` ran)."""

    @property
    def directory(self) -> Path:
        return Path(self.path)

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        super().reset(checkpoint_id)
        self.hashing = DigestingFileSystem()
        self.fs = self.hashing
        self.digests = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        if not self.use_collectives:
            raise UsageError(
                "a signed DCP save is one step over every rank: save with collectives "
                "(use_collectives=True)",
                path=self.directory,
            )

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        self.fs.mkdir(self.path)
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # The coordinator, before any rank writes: the directory must be one this save may
        # fill (no signed step there; only DCP's own files of an unfinished save).
        _clear_unfinished(self.directory)
        return super().prepare_global_plan(plans)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        written = super().write_data(plan, planner).value()
        mine = _RankDigests(
            rank=self.rank or 0,
            files=tuple(w for name, w in sorted(self.hashing.written.items()) if name != METADATA),
        )
        done: Future[list[WriteResult]] = Future()
        done.set_result(
            [*written, WriteResult(MetadataIndex(_DIGESTS), size_in_bytes=0, storage_data=mine)]
        )
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        ranks, plain = _split_results(results, self.directory)
        super().finish(metadata, plain)  # .metadata, written through self.fs: hashed
        self.digests = _save_digests(
            self.directory, ranks, plain, self.hashing.written.get(METADATA)
        )
        self.publish(self.digests)

    def publish(self, digests: SaveDigests) -> None:
        """Sign the saved directory as this writer's step, from ``digests`` (the
        coordinator, once ``.metadata`` is written): a directory step whose files are
        those hashed as they were written (never read again) and whose data files list
        their items; DCP's tensors by global name are read from the directory as
        ``kaudit snapshot`` reads them."""
        manifest = manifest_path_for(self.directory)
        parent = self.parent
        if parent is None:
            parent = previous_manifest(self.directory.parent, self.run, self.step, skip=manifest)
        snapshot(
            self.directory,
            run=self.run,
            step=self.step,
            seeds=self.seeds,
            parent=parent,
            key=self.key,
            attributes=self.attributes or None,
            tensors=self.tensors,
            files=[
                FileEntry(
                    f.name,
                    f.size,
                    f.sha256,
                    f.md5,
                    items=None
                    if f.name == METADATA
                    else tuple(
                        ItemDigest(i.fqn, i.chunk, i.offset, i.length, i.sha256)
                        for i in digests.items
                        if i.file == f.name
                    ),
                )
                for f in digests.files
            ],
        )


def _clear_unfinished(directory: Path) -> None:
    """Refuse a directory whose save was signed, or that holds a whole DCP save (its
    ``.metadata``: a checkpoint someone may want); remove what an unfinished save left
    (DCP's names only, no ``.metadata``: nothing DCP could load)."""
    if os.path.lexists(manifest_path_for(directory)):
        raise UsageError(
            f"already signed ({manifest_path_for(directory).name} is beside it): a signed "
            "step is never written over",
            path=directory,
        )
    if os.path.lexists(directory / METADATA):
        raise UsageError(
            "holds a whole DCP save that was never signed: sign it (kaudit snapshot), or "
            "move it away, before saving a signed step here",
            path=directory,
        )
    with os.scandir(directory) as listing:
        entries = list(listing)
    leftovers = []
    for entry in entries:
        name = entry.name
        dcp_name = name in (METADATA, METADATA + ".tmp") or (
            name.startswith("__") and name.endswith(".distcp")
        )
        if not dcp_name or not entry.is_file(follow_symlinks=False):
            raise UsageError(
                f"holds {name[:200]!r}, which is not a file DCP writes: a signed step's "
                "directory holds its save alone",
                path=directory,
            )
        leftovers.append(entry.path)
    for leftover in leftovers:
        os.unlink(leftover)


def _split_results(
    results: list[list[WriteResult]], directory: Path
) -> tuple[list[_RankDigests], list[list[WriteResult]]]:
    """Each rank's digests, and the write results DCP knows (the digests taken out)."""
    ranks, plain = [], []
    for n, rank_results in enumerate(results):
        mine = [r for r in rank_results if r.index.fqn == _DIGESTS]
        if len(mine) != 1 or not isinstance(mine[0].storage_data, _RankDigests):
            raise UsageError(
                f"rank {n} saved without a SignedWriter: every rank must sign", path=directory
            )
        ranks.append(mine[0].storage_data)
        plain.append([r for r in rank_results if r.index.fqn != _DIGESTS])
    return ranks, plain


def _save_digests(
    directory: Path,
    ranks: Sequence[_RankDigests],
    results: Sequence[Sequence[WriteResult]],
    metadata: Written | None,
) -> SaveDigests:
    """The table of every file and item of the save the coordinator just finished."""
    if metadata is None:
        raise CheckpointError(
            ".metadata was not written through the signing writer", path=directory
        )
    files: dict[str, Written] = {METADATA: metadata}
    for r in ranks:
        for w in r.files:
            if w.file.name in files:
                raise CheckpointError(f"{w.file.name} was written twice", path=directory)
            files[w.file.name] = w
    items = []
    for rank_results in results:
        for result in rank_results:
            info = result.storage_data
            if not isinstance(info, _StorageInfo):
                raise CheckpointError("a write result holds no DCP storage info", path=directory)
            holder = files.get(info.relative_path)
            found = None if holder is None else holder.items.get(info.offset)
            if found is None or found[0] != info.length:
                raise CheckpointError(
                    f"{result.index.fqn}: its bytes in {info.relative_path} were not "
                    "hashed as one item",
                    path=directory,
                )
            chunk = None if result.index.offset is None else tuple(result.index.offset)
            items.append(
                ItemRecord(
                    result.index.fqn,
                    chunk,
                    info.relative_path,
                    info.offset,
                    info.length,
                    found[1],
                )
            )
    # Every file in the directory is one this save wrote (the coordinator cleared it).
    with os.scandir(directory) as listing:
        present = sorted(e.name for e in listing)
    for name in present:
        if name not in files:
            raise CheckpointError(
                f"holds {name[:200]!r}, which this save did not write", path=directory
            )
    records = [files[name].file for name in sorted(files)]
    return SaveDigests(
        tuple(records),
        tuple(sorted(items, key=lambda i: (i.file, i.offset))),
    )


# -- reading -------------------------------------------------------------------------------


class VerifiedReader(FileSystemReader):
    """DCP's ``FileSystemReader`` that reads only what a trusted signer signed.

    ``.metadata`` is checked against its signed digest before it is unpickled (and then
    unpickled naming DCP's metadata classes alone); each item is read into memory, checked
    against its signed sha256, and only then given to DCP. A mismatch raises
    :class:`~kronos_audit.errors.TamperedData` naming the tensor (DCP wraps it in its
    ``CheckpointException``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        trust: TrustOptions | None = None,
    ) -> None:
        super().__init__(path)
        self.trust = trust
        self._digests: SaveDigests | None = None

    @property
    def directory(self) -> Path:
        return Path(self.path)

    def verified_digests(self) -> SaveDigests:
        """The files and items of the step's manifest, once its signature (a trusted
        key), its place and its chain verified; read once per load."""
        if self._digests is None:
            self._digests = _signed_digests(verified_signature(self.directory, self.trust))
        return self._digests

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None and Path(checkpoint_id) != self.directory:
            self._digests = None  # another directory: its own manifest decides
        super().reset(checkpoint_id)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise UsageError("a signed DCP step has one .metadata, not one per rank")
        digests = self.verified_digests()
        signed = digests.file(METADATA)
        if signed is None:
            raise TamperedData("the signed step lists no .metadata", path=self.directory)
        where = self.directory / METADATA
        data = _read_signed(where, signed)
        metadata = load_metadata(data, where)
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return cast(Metadata, metadata)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        digests = self.verified_digests()
        per_file: dict[str, list[ReadItem]] = {}
        for req in plan.items:
            info: _StorageInfo = self.storage_data[req.storage_index]
            per_file.setdefault(info.relative_path, []).append(req)
        for name, reqs in per_file.items():
            signed_file = digests.file(name)
            if signed_file is None or name == METADATA:
                raise TamperedData(
                    f"{name[:200]!r} is not a file of the signed step", path=self.directory
                )
            with _open_signed(self.directory / name, signed_file) as fd:
                verified: dict[tuple[int, int], bytes] = {}
                for req in sorted(reqs, key=lambda r: self.storage_data[r.storage_index].offset):
                    info = self.storage_data[req.storage_index]
                    key = (info.offset, info.length)
                    if key not in verified:
                        verified = {key: _read_item(fd, name, info, digests, self.directory)}
                    self._load(req, info, verified[key], planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _load(self, req: ReadItem, info: _StorageInfo, data: bytes, planner: LoadPlanner) -> None:
        """DCP's own load of one item, from the verified bytes."""
        stream = self.transforms.transform_load_stream(
            req, info.transform_descriptors or (), io.BytesIO(data)
        )
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(stream.read(-1)))
            return
        seekable = stream if stream.seekable() else io.BytesIO(stream.read(-1))
        tensor = cast(torch.Tensor, torch.load(seekable, map_location="cpu", weights_only=True))
        tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            raise CheckpointError(
                f"{req.storage_index.fqn}: saved as {list(tensor.size())}, loading into "
                f"{list(target.size())}",
                path=self.directory,
            )
        target.copy_(tensor)
        planner.commit_tensor(req, target)


def _signed_digests(manifest: Manifest) -> SaveDigests:
    """The table a verified DCP step's manifest signs: every file, and every item of the
    data files (a step signed otherwise than by :class:`SignedWriter` has none)."""
    record = manifest.record.directory
    if record is None:
        raise TamperedData("its manifest signs no directory step", path=manifest.path)
    files = tuple(FileRecord(f.path, f.size, f.sha256, f.md5) for f in record.files)
    items = tuple(
        ItemRecord(i.name, i.chunk, f.path, i.offset, i.length, i.sha256)
        for f in record.files
        for i in f.items or ()
    )
    if not items:
        raise UsageError(
            "its manifest records no DCP item digests (it was not signed by SignedWriter): "
            "check it with `kaudit verify`, then load it with DCP's own reader",
            path=manifest.checkpoint_path,
        )
    return SaveDigests(files, tuple(sorted(items, key=lambda i: (i.file, i.offset))))


def _read_signed(path: Path, signed: FileRecord) -> bytes:
    try:
        data = read_regular(path, min(signed.size, METADATA_LIMIT), follow_symlinks=False)
    except UnsafeFile as e:
        raise TamperedData(e.reason, path=path) from None
    if len(data) != signed.size or hashlib.sha256(data).hexdigest() != signed.sha256:
        raise TamperedData("differs from its signed digest: not unpickled", path=path)
    return data


class _open_signed:
    """One descriptor on a data file of the step: a regular file, not a link, of the
    signed size."""

    def __init__(self, path: Path, signed: FileRecord) -> None:
        self.path, self.signed = path, signed
        self.fd = -1

    def __enter__(self) -> int:
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            self.fd = os.open(self.path, flags)
            st = os.fstat(self.fd)
        except OSError as e:
            raise TamperedData(f"cannot read it: {e.strerror or e}", path=self.path) from None
        if not stat.S_ISREG(st.st_mode) or st.st_size != self.signed.size:
            os.close(self.fd)
            raise TamperedData(
                f"is not the signed file of {self.signed.size:,} bytes", path=self.path
            )
        return self.fd

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _read_item(fd: int, name: str, info: _StorageInfo, digests: SaveDigests, where: Path) -> bytes:
    """One item's bytes, read through ``fd`` and checked against the signed sha256."""
    signed: ItemRecord | None = digests.item_at(name, info.offset, info.length)
    if signed is None:
        raise TamperedData(
            f"{name}: bytes {info.offset}+{info.length} are no item of the signed step",
            path=where,
        )
    chunks, done = [], 0
    while done < info.length:
        chunk = os.pread(fd, min(info.length - done, 1 << 26), info.offset + done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    data = b"".join(chunks)
    if len(data) != info.length or hashlib.sha256(data).hexdigest() != signed.sha256:
        raise TamperedData(
            f"{signed.label} in {name} differs from its signed digest: not loaded", path=where
        )
    return data


__all__ = ["SignedWriter", "VerifiedReader"]
