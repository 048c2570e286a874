"""What a signed DCP save records, and how it is hashed: from memory, as DCP writes it.

DCP's ``FileSystemWriter`` writes every file through ``FileSystem.create_stream`` and asks
the stream for its position (``tell``) right before and right after each item it writes
(a tensor chunk as ``torch.save`` bytes, or a pickled object). :class:`DigestingFileSystem`
hands it a :class:`HashingStream`, which hashes each buffer on its way to the file: the
file's sha256 (the manifest's) and md5 (DVC's address), and the sha256 of the bytes written
since the last ``tell``, which is one item's. Nothing is read back.

A save is described by :class:`SaveDigests`: every file of the checkpoint directory and
every item of ``.metadata``'s storage map, where it is (file, offset, length) and its
sha256: what the step's manifest records (each data file's ``items``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import threading
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from torch.distributed.checkpoint.filesystem import FileSystem

from kronos_audit.errors import CheckpointError

_EMPTY_SHA256 = hashlib.sha256().hexdigest()
_EMPTY_MD5 = hashlib.md5(usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class FileRecord:
    """One file of a saved checkpoint directory."""

    name: str
    """Its name in the directory (DCP writes no subdirectories)."""
    size: int
    """Bytes."""
    sha256: str
    """sha256 of the file."""
    md5: str
    """md5 of the file: DVC's address for it."""


@dataclass(frozen=True)
class ItemRecord:
    """One item of ``.metadata``'s storage map: what DCP reads for one tensor chunk or one
    pickled object."""

    fqn: str
    """The state dict's fully qualified name (``model.layer.weight``)."""
    chunk: tuple[int, ...] | None
    """The chunk's offsets in the global tensor; None for a pickled object."""
    file: str
    """The file that holds it."""
    offset: int
    """Where its bytes start in that file."""
    length: int
    """How many bytes it takes."""
    sha256: str
    """sha256 of those bytes."""

    @property
    def label(self) -> str:
        """How a message names it: ``tensor model.weight`` (with its chunk's offsets when
        the tensor is saved in several chunks) or ``object step``."""
        if self.chunk is None:
            return f"object {self.fqn}"
        at = "" if not any(self.chunk) else f" (chunk at {list(self.chunk)})"
        return f"tensor {self.fqn}{at}"


@dataclass(frozen=True)
class SaveDigests:
    """Every file and every item of one DCP save."""

    files: tuple[FileRecord, ...]
    """Each file of the directory, sorted by name."""
    items: tuple[ItemRecord, ...]
    """Each item, sorted by file and offset."""

    def file(self, name: str) -> FileRecord | None:
        return next((f for f in self.files if f.name == name), None)

    def item_at(self, file: str, offset: int, length: int) -> ItemRecord | None:
        """The item stored at exactly these bytes, or None."""
        return self._by_place().get((file, offset, length))

    def _by_place(self) -> dict[tuple[str, int, int], ItemRecord]:
        cached: dict[tuple[str, int, int], ItemRecord] | None = self.__dict__.get("_places")
        if cached is None:
            cached = {(i.file, i.offset, i.length): i for i in self.items}
            object.__setattr__(self, "_places", cached)
        return cached


# -- hashing as DCP writes -----------------------------------------------------------------


class HashingStream:
    """A file DCP writes into: each buffer is hashed (the file's sha256 and md5, and the
    current item's sha256) before it goes to the file. ``tell`` ends an item."""

    def __init__(self, raw: io.BufferedWriter) -> None:
        self._raw = raw
        self._sha256 = hashlib.sha256()
        self._md5 = hashlib.md5(usedforsecurity=False)
        self._pos = 0
        self._item = hashlib.sha256()
        self._item_start = 0
        self.items: dict[int, tuple[int, str]] = {}
        """Each run of bytes between two ``tell`` calls: offset -> (length, sha256)."""

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._sha256.update(view)
        self._md5.update(view)
        self._item.update(view)
        written = self._raw.write(view)
        if written != len(view):  # a BufferedWriter writes all or raises: never silently less
            raise OSError(f"wrote {written} of {len(view)} bytes")
        self._pos += len(view)
        return len(view)

    def tell(self) -> int:
        self._end_item()
        return self._pos

    def _end_item(self) -> None:
        if self._pos > self._item_start:
            self.items[self._item_start] = (self._pos - self._item_start, self._item.hexdigest())
            self._item = hashlib.sha256()
        self._item_start = self._pos

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False  # a seek would make the running digests wrong

    def close(self) -> None:
        self._end_item()
        self._raw.close()

    @property
    def closed(self) -> bool:
        return self._raw.closed

    def record(self, name: str) -> FileRecord:
        return FileRecord(name, self._pos, self._sha256.hexdigest(), self._md5.hexdigest())

    def __enter__(self) -> HashingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Written:
    """One file as its writer hashed it."""

    file: FileRecord
    items: Mapping[int, tuple[int, str]]
    """offset -> (length, sha256) of each item written into it."""


class DigestingFileSystem(FileSystem):
    """DCP's local file system, with every file written through a :class:`HashingStream`
    and what each one hashed kept by name (:attr:`written`), across renames."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.written: dict[str, Written] = {}

    @contextlib.contextmanager
    def create_stream(
        self, path: str | os.PathLike[str], mode: str
    ) -> Generator[io.IOBase, None, None]:
        if "r" in mode:
            with super().create_stream(path, mode) as reading:
                yield reading
            return
        if mode != "wb":
            raise CheckpointError(f"DCP asked to open a file as {mode!r}", path=Path(path))
        path = Path(path)
        with path.open("xb") as raw:  # never into a file that exists: a save writes anew
            stream = HashingStream(raw)
            yield cast(io.IOBase, stream)
            stream.close()
        with self._lock:
            self.written[path.name] = Written(stream.record(path.name), stream.items)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        with self._lock:
            done = self.written.pop(Path(path).name, None)
            if done is not None:
                name = Path(new_path).name
                f = done.file
                self.written[name] = Written(FileRecord(name, f.size, f.sha256, f.md5), done.items)

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        super().rm_file(path)
        with self._lock:
            self.written.pop(Path(path).name, None)

    def __getstate__(self) -> dict[str, Any]:  # an async save may pickle the writer
        return {"written": dict(self.written)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._lock = threading.Lock()
        self.written = state["written"]


def empty_file(name: str) -> FileRecord:
    return FileRecord(name, 0, _EMPTY_SHA256, _EMPTY_MD5)


# -- reading .metadata ---------------------------------------------------------------------

_METADATA_CLASSES = frozenset(
    {
        ("torch.distributed.checkpoint.metadata", "Metadata"),
        ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "TensorProperties"),
        ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
        ("torch.distributed.checkpoint.metadata", "StorageMeta"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
        # a layout pickles as a call of this with its name ("torch.strided"): a dict lookup
        ("torch.serialization", "_get_layout"),
        ("torch", "Size"),
        ("torch", "device"),
        ("torch", "layout"),
        ("torch", "memory_format"),
        ("collections", "OrderedDict"),
        # StorageMeta's checkpoint_id: the path the writer was given
        ("pathlib", "PosixPath"),
        ("pathlib._local", "PosixPath"),
    }
)
"""What ``.metadata`` may name: DCP's metadata classes and the torch values they hold."""


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles ``.metadata`` naming nothing but :data:`_METADATA_CLASSES` and torch's
    dtypes (``torch.float32`` pickles as the global it is)."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if (module, name) in _METADATA_CLASSES or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise CheckpointError(f".metadata names {module[:100]}.{name[:100]}, not DCP's metadata")


def load_metadata(data: bytes, where: Path) -> Any:
    """The ``Metadata`` that ``data`` (``.metadata``'s bytes, verified) pickles, through an
    unpickler that allows DCP's metadata classes alone."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except CheckpointError as e:
        raise CheckpointError(e.message, path=where) from None
    except Exception as e:  # a signed file that still does not unpickle: say so, in a line
        raise CheckpointError(f"not DCP metadata: {type(e).__name__}", path=where) from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError("not DCP metadata", path=where)
    return metadata
