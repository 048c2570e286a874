"""torch distributed checkpoints (DCP): a directory of ``.metadata`` and ``__R_N.distcp``
files, read without torch and without unpickling anything untrusted.

``.metadata`` is a pickle of torch's ``Metadata``: every tensor by fully qualified name
with its global size and chunks, and where each chunk's bytes lie (file, offset, length).
It is parsed by :class:`MetadataUnpickler`, which builds inert stand-ins for DCP's own
metadata classes and refuses every other global (``os.system``, ``builtins.eval``...): no
code of the file's choosing runs. Still, call :func:`read_metadata` only on bytes whose
digest a verified signature covers (a snapshot signs its own directory; verify hashes the
file against the signed digest first): that is the precondition for reading it at all.

Each chunk is a ``torch.save`` zip inside its byte range: ``data.pkl`` (a call of
``torch._utils._rebuild_tensor_v2`` on a storage, read by the same kind of restricted
unpickler) and the storage's raw little-endian bytes. Chunks are assembled into the global
tensor, which must be tiled exactly, and digested as its canonical bytes: so a state saved
on one rank and on two has one digest per tensor, equal to that of the same array in any
other format. A non-tensor item (DCP's bytes items: ``torch.save`` of a Python value) is
digested by its pickle stream, never unpickled.

What is hashed is what is read: :func:`load_opened` reads the files a caller opened and
hashed (``.metadata`` from its private copy, parsed only from it), never their names again
(:func:`open_dcp` opens them for a caller that hashes nothing). A directory is DCP's only
when its ``.metadata`` is DCP's pickle (:func:`is_dcp_metadata`, from the opcodes, nothing
run) beside ``__R_N.distcp`` files; any other ``.metadata`` is another tool's file.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import pickletools
import re
import stat
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kronos_audit.checkpoint.formats.common import (
    BFLOAT16,
    BytesReader,
    exotic_as_float32,
    storage_dtype,
    tensor_path,
)
from kronos_audit.checkpoint.formats.interface import Format, Tensor
from kronos_audit.checkpoint.hashing import DatasetDigest, OpenFile, canonical_bytes, open_file
from kronos_audit.errors import CheckpointError

METADATA = ".metadata"
MAX_METADATA = 64 * 1024 * 1024
"""The largest ``.metadata`` read, in bytes."""
MAX_DATA_PKL = 1024 * 1024
"""The largest ``data.pkl`` of one chunk read: it describes one tensor."""
DATA_FILE = re.compile(r"__\d+_\d+\.distcp")
"""The only names a chunk's file may have: nothing outside the directory."""
SNIFF_BYTES = 4096
"""Bytes of a ``.metadata`` read to tell whether it is DCP's."""
_SNIFF_OPS = 16
"""Opcodes read before the first global of DCP's pickle (it is the third)."""
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
PICKLE_ITEM = "pickle"
"""The dtype name of a non-tensor item: digested by its pickle stream, never unpickled."""

DTYPES: Mapping[str, str] = {
    "float32": "<f4",
    "float64": "<f8",
    "float16": "<f2",
    "bfloat16": BFLOAT16,
    "int64": "<i8",
    "int32": "<i4",
    "int16": "<i2",
    "int8": "|i1",
    "uint8": "|u1",
    "bool": "|b1",
    "complex64": "<c8",
    "complex128": "<c16",
}
"""torch dtypes kaudit reads, by name, and their canonical names."""
STORAGES: Mapping[str, str] = {
    "FloatStorage": "float32",
    "DoubleStorage": "float64",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
}


class _Record:
    """An inert stand-in for one of DCP's metadata classes: its state, nothing more."""

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state = {**(state[0] or {}), **state[1]}  # (dict, slots)
        if isinstance(state, dict):
            self.__dict__.update({str(k): v for k, v in state.items()})
        else:
            self.state = state  # TensorProperties: (dtype, layout, ...)


def _stand_in(name: str) -> type:
    return type(name, (_Record,), {})


_METADATA_CLASSES = {
    name: _stand_in(name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "StorageMeta",
        "MetadataIndex",
    )
}
_StorageInfo = _stand_in("_StorageInfo")


def _dtype(name: str) -> Any:
    def make() -> str:
        return name

    return make


class MetadataUnpickler(pickle.Unpickler):
    """Reads a DCP ``.metadata`` pickle into stand-ins: only DCP's metadata classes,
    ``torch.Size``, torch's dtypes and layouts and a path are allowed as globals, each
    mapped to something inert; any other global is refused (UnpicklingError)."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch.distributed.checkpoint.metadata":
            if name in _METADATA_CLASSES:
                return _METADATA_CLASSES[name]
            if name == "_MEM_FORMAT_ENCODING":
                return lambda value: value
        if module == "torch.distributed.checkpoint.filesystem" and name == "_StorageInfo":
            return _StorageInfo
        if module == "torch" and name == "Size":
            return tuple
        if module == "torch" and name in DTYPES:
            return _DtypeName(name)
        if module == "torch.serialization" and name == "_get_layout":
            return str
        if module == "pathlib" and name in ("PosixPath", "PurePosixPath", "Path"):
            return lambda *parts: "/".join(str(p) for p in parts)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in DCP metadata")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not allowed in DCP metadata")


class _DtypeName(str):
    """A torch dtype, read as its name (torch pickles a dtype as the global itself)."""


class _ChunkUnpickler(pickle.Unpickler):
    """Reads one chunk's ``data.pkl``: ``_rebuild_tensor_v2`` of a storage, nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild
        if module == "torch" and name in STORAGES:
            return _DtypeName(STORAGES[name])
        if module == "collections" and name == "OrderedDict":
            return dict
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a DCP chunk")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError("a DCP chunk's storage id is malformed")
        _, kind, key, _, numel = pid
        if not (isinstance(kind, _DtypeName) and isinstance(key, str) and isinstance(numel, int)):
            raise pickle.UnpicklingError("a DCP chunk's storage id is malformed")
        return ("storage", str(kind), key, numel)


_MALFORMED = (
    pickle.UnpicklingError,
    EOFError,
    ValueError,
    TypeError,
    AttributeError,
    IndexError,
)
"""What a restricted unpickler raises on a malformed stream (never an arbitrary call)."""


def _rebuild(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> Any:
    return ("tensor", storage, offset, tuple(size), tuple(stride))


def read_metadata(data: bytes, where: Path | str) -> Any:
    """A DCP ``.metadata``'s content, as stand-ins (see the module docstring). Precondition:
    ``data``'s digest is covered by a verified signature, or ``data`` is about to be signed
    by its owner. CheckpointError for a pickle that is malformed or names another global."""
    try:
        return MetadataUnpickler(io.BytesIO(data)).load()
    except _MALFORMED as e:
        raise CheckpointError(f"DCP metadata refused: {e}", path=where) from None
    except RecursionError:
        raise CheckpointError("DCP metadata refused: nested too deep", path=where) from None


def is_dcp_metadata(head: bytes) -> bool:
    """Whether ``head`` (the first bytes of a ``.metadata`` file) starts a pickle of DCP's
    ``Metadata``: its first global, read from the opcodes without running any, is
    ``torch.distributed.checkpoint.metadata.Metadata``. Another tool's ``.metadata`` is
    not DCP's, and its directory is plain files."""
    strings: list[str] = []
    try:
        for n, (op, arg, _) in enumerate(pickletools.genops(head)):
            if n >= _SNIFF_OPS:
                return False
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                strings.append(str(arg))
            elif op.name == "STACK_GLOBAL":
                return strings[-2:] == [_METADATA_MODULE, "Metadata"]
            elif op.name == "GLOBAL":
                return str(arg) == f"{_METADATA_MODULE} Metadata"
            elif op.name not in ("PROTO", "FRAME", "MEMOIZE"):
                return False  # something else before the first global: not DCP's pickle
    except (ValueError, pickle.UnpicklingError, EOFError):  # cut short, or not a pickle
        return False
    return False


def is_dcp(path: Path) -> bool:
    """Whether ``path`` is a torch DCP directory: a ``.metadata`` file (a regular file,
    not a link) that is DCP's (:func:`is_dcp_metadata`) beside at least one
    ``__R_N.distcp`` file. Only its first bytes are read."""
    meta = path / METADATA
    try:
        if not (path.is_dir() and stat.S_ISREG(os.lstat(meta).st_mode)):
            return False
        if not any(DATA_FILE.fullmatch(name) for name in os.listdir(path)):
            return False
        with open_file(meta, follow_symlinks=False) as opened:
            return is_dcp_metadata(bytes(opened.view()[:SNIFF_BYTES]))
    except (OSError, CheckpointError):
        return False


def is_spanned(name: str) -> bool:
    """Whether the file ``name`` (relative to its directory) is one DCP spreads a save
    over: ``.metadata`` or a ``__R_N.distcp`` file at the top of the directory."""
    return name == METADATA or DATA_FILE.fullmatch(name) is not None


class _Files:
    """The directory's chunk files, already opened (each once, never through a link):
    chunks are read from these descriptors (or their private copies), never by name."""

    def __init__(self, root: Path, opened: Mapping[str, OpenFile]) -> None:
        self.root = root
        self._open = opened

    def view(self, name: str) -> memoryview:
        if not DATA_FILE.fullmatch(name):
            raise CheckpointError(
                f"DCP metadata names file {name[:80]!r}: not a .distcp file of the directory",
                path=self.root,
            )
        opened = self._open.get(name)
        if opened is None:
            raise CheckpointError(f"its chunk file {name} is not there", path=self.root)
        return opened.view()


def read_opened_metadata(opened: OpenFile) -> Any:
    """The content of a ``.metadata`` opened and read into its private copy
    (:meth:`~kronos_audit.checkpoint.hashing.OpenFile.read_private`: what was hashed is
    what is parsed), as :func:`read_metadata` gives it."""
    if opened.size > MAX_METADATA:
        raise CheckpointError(f"DCP metadata of {opened.size:,} bytes refused", path=opened.path)
    if not opened.private:  # a map of the descriptor: a writer could change it meanwhile
        raise CheckpointError("DCP metadata is parsed from its private copy only", path=opened.path)
    return read_metadata(bytes(opened.view()), opened.path)


def _chunk(view: memoryview, where: Path, fqn: str) -> tuple[str, np.ndarray[Any, Any]] | bytes:
    """One saved item's bytes: a tensor chunk as (dtype name, raw array), or a non-tensor
    item as its pickle stream (a bytes item)."""
    try:
        zf = zipfile.ZipFile(BytesReader(view))
    except (zipfile.BadZipFile, ValueError, OSError, EOFError):
        return bytes(view)  # a raw bytes item
    with zf:
        names = {n.split("/", 1)[-1]: n for n in zf.namelist()}
        if "data.pkl" not in names:
            raise CheckpointError(
                f"DCP item {fqn!r}: a torch.save zip without data.pkl", path=where, dataset=fqn
            )
        info = zf.getinfo(names["data.pkl"])
        if info.file_size > MAX_DATA_PKL:
            raise CheckpointError(f"DCP item {fqn!r}: data.pkl too large", path=where, dataset=fqn)
        pkl = zf.read(info)
        if not any(n.startswith("data/") for n in names):
            return pkl  # a Python value: its pickle stream, never unpickled
        if "byteorder" in names and zf.read(names["byteorder"]).strip() != b"little":
            raise CheckpointError(
                f"DCP item {fqn!r}: big-endian data is not read", path=where, dataset=fqn
            )
        try:
            spec = _ChunkUnpickler(io.BytesIO(pkl)).load()
        except _MALFORMED as e:
            raise CheckpointError(
                f"DCP item {fqn!r} refused: {e}", path=where, dataset=fqn
            ) from None
        if not (isinstance(spec, tuple) and spec[0] == "tensor" and isinstance(spec[1], tuple)):
            raise CheckpointError(f"DCP item {fqn!r}: not one tensor", path=where, dataset=fqn)
        _, (_, torch_dtype, key, numel), offset, size, stride = spec
        member = names.get(f"data/{key}")
        if member is None:
            raise CheckpointError(
                f"DCP item {fqn!r}: its storage is missing", path=where, dataset=fqn
            )
        name = DTYPES[torch_dtype]
        raw_dtype = storage_dtype(name) if name == BFLOAT16 else np.dtype(name)
        raw = zf.read(member)
    if len(raw) != numel * raw_dtype.itemsize:
        raise CheckpointError(
            f"DCP item {fqn!r}: storage of the wrong size", path=where, dataset=fqn
        )
    storage = np.frombuffer(raw, raw_dtype)
    reach = (
        offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
        if all(size)
        else offset - 1
    )
    if offset < 0 or any(s < 0 for s in stride) or reach >= numel:
        raise CheckpointError(
            f"DCP item {fqn!r}: its view lies outside its storage", path=where, dataset=fqn
        )
    strides = tuple(s * raw_dtype.itemsize for s in stride)
    arr = np.lib.stride_tricks.as_strided(storage[offset:], shape=size, strides=strides)
    return name, np.ascontiguousarray(arr)


@dataclass(frozen=True)
class Loaded:
    """What a DCP save's files hold, read from the descriptors handed in."""

    digests: dict[str, DatasetDigest]
    """Every item's digest by fully qualified name (those read)."""
    arrays: dict[str, np.ndarray[Any, Any]]
    """Every tensor's global array by fully qualified name (bfloat16 as float32), when
    asked for."""
    unreadable: dict[str, str]
    """Each item that could not be read, with why, when asked to go on past it."""


def load_opened(
    meta: OpenFile,
    files: Mapping[str, OpenFile],
    *,
    arrays: bool = False,
    go_on: bool = False,
) -> Loaded:
    """The items of the DCP save whose ``.metadata`` is ``meta`` (read into its private
    copy: the bytes hashed are the bytes parsed) and whose ``.distcp`` files are ``files``
    (by name; each chunk is read from these, never by name again). ``arrays``: keep each
    tensor's global array (else only its digest). ``go_on``: an item that cannot be read
    (a chunk missing or malformed) is recorded in ``unreadable`` and the others read; else
    CheckpointError names it. Precondition: see :func:`read_metadata`."""
    meta_path = meta.path
    md = read_opened_metadata(meta)
    try:
        items = dict(md.state_dict_metadata)
        storage = dict(md.storage_data)
    except (AttributeError, TypeError, ValueError):
        raise CheckpointError("DCP metadata is not a Metadata record", path=meta_path) from None
    chunks = _Files(meta_path.parent, files)
    out = Loaded({}, {}, {})
    try:
        by_fqn: dict[str, list[tuple[Any, Any]]] = {}
        for index, info in storage.items():
            if getattr(info, "transform_descriptors", None):
                raise CheckpointError("DCP stream transforms are not read", path=meta_path)
            by_fqn.setdefault(str(index.fqn), []).append((index, info))
        for fqn, item in items.items():
            fqn = str(fqn)
            problem = _read_item(out, fqn, item, by_fqn.get(fqn, []), chunks, arrays=arrays)
            if problem is not None and not go_on:
                # Raised here, not from the handler that caught it: nothing of the failed
                # read (its frames, the views of the files they hold) outlives this call.
                raise CheckpointError(problem, path=meta_path, dataset=fqn)
            if problem is not None:
                out.unreadable[fqn] = problem
    except (AttributeError, TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"DCP metadata is malformed ({e})", path=meta_path) from None
    return out


def _read_item(
    out: Loaded, fqn: str, item: Any, parts: list[tuple[Any, Any]], files: _Files, *, arrays: bool
) -> str | None:
    """Read one item into ``out``; what kept it from being read, or None."""
    try:
        _item(out, fqn, item, parts, files, files.root / METADATA, arrays=arrays)
    except CheckpointError as e:
        return e.message
    except (zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError, EOFError) as e:
        return f"its chunk is not a readable torch.save zip ({str(e)[:200]})"
    return None


def _item(
    out: Loaded,
    fqn: str,
    item: Any,
    parts: list[tuple[Any, Any]],
    files: _Files,
    meta_path: Path,
    *,
    arrays: bool,
) -> None:
    """Read one item into ``out``."""
    path = tensor_path(fqn)
    if type(item).__name__ == "BytesStorageMetadata":
        if len(parts) != 1:
            raise CheckpointError(
                f"DCP item {fqn!r} is stored {len(parts)} times", path=meta_path, dataset=fqn
            )
        got = _chunk(_range(files, parts[0][1], meta_path, fqn), meta_path, fqn)
        data = got if isinstance(got, bytes) else canonical_bytes(got[1], got[1].dtype)
        out.digests[fqn] = DatasetDigest(path, PICKLE_ITEM, None, hashlib.sha256(data).hexdigest())
        return
    name, glob = _assemble(item, parts, files, meta_path, fqn)
    h = hashlib.sha256(canonical_bytes(glob, glob.dtype)) if glob.size else hashlib.sha256()
    out.digests[fqn] = DatasetDigest(path, name, tuple(glob.shape), h.hexdigest())
    if arrays:
        out.arrays[fqn] = exotic_as_float32(name, glob) if name == BFLOAT16 else glob


@contextmanager
def open_dcp(root: Path) -> Iterator[tuple[OpenFile, dict[str, OpenFile]]]:
    """The DCP directory ``root``'s ``.metadata`` (read into its private copy) and its
    ``__R_N.distcp`` files, each opened once (never through a link), for
    :func:`load_opened`; closed after."""
    opened: dict[str, OpenFile] = {}
    try:
        meta = open_file(root / METADATA, follow_symlinks=False)
        opened[METADATA] = meta
        if meta.size > MAX_METADATA:
            raise CheckpointError(f"DCP metadata of {meta.size:,} bytes refused", path=meta.path)
        meta.read_private()
        for name in sorted(os.listdir(root)):
            if DATA_FILE.fullmatch(name):
                opened[name] = open_file(root / name, follow_symlinks=False)
        yield meta, {n: o for n, o in opened.items() if n != METADATA}
    except OSError as e:
        raise CheckpointError(f"cannot read it: {e.strerror or e}", path=root) from None
    finally:
        for o in opened.values():
            o.close()


def _range(files: _Files, info: Any, where: Path, fqn: str) -> memoryview:
    view = files.view(str(info.relative_path))
    offset, length = int(info.offset), int(info.length)
    if offset < 0 or length < 0 or offset + length > len(view):
        raise CheckpointError(
            f"DCP item {fqn!r} lies outside {info.relative_path}", path=where, dataset=fqn
        )
    return view[offset : offset + length]


def _assemble(
    item: Any, parts: list[tuple[Any, Any]], files: _Files, where: Path, fqn: str
) -> tuple[str, np.ndarray[Any, Any]]:
    state = item.properties.state if hasattr(item.properties, "state") else (item.properties.dtype,)
    torch_dtype = str(state[0])
    if torch_dtype not in DTYPES:
        raise CheckpointError(
            f"DCP tensor {fqn!r}: dtype {torch_dtype[:40]} is not read", path=where, dataset=fqn
        )
    name = DTYPES[torch_dtype]
    raw_dtype = storage_dtype(name) if name == BFLOAT16 else np.dtype(name)
    shape = tuple(int(n) for n in item.size)
    if any(n < 0 for n in shape):
        raise CheckpointError(f"DCP tensor {fqn!r}: negative size", path=where, dataset=fqn)
    glob = np.zeros(shape, raw_dtype)
    covered = np.zeros(shape, np.uint8)
    for index, info in parts:
        got = _chunk(_range(files, info, where, fqn), where, fqn)
        if isinstance(got, bytes) or got[0] != name:
            raise CheckpointError(
                f"DCP tensor {fqn!r}: a chunk of another kind", path=where, dataset=fqn
            )
        chunk = got[1]
        start = tuple(int(o) for o in (index.offset or (0,) * len(shape)))
        if len(start) != len(shape) or chunk.ndim != len(shape):
            raise CheckpointError(
                f"DCP tensor {fqn!r}: a chunk of another rank", path=where, dataset=fqn
            )
        if any(o < 0 or o + n > s for o, n, s in zip(start, chunk.shape, shape, strict=True)):
            raise CheckpointError(
                f"DCP tensor {fqn!r}: a chunk outside its size", path=where, dataset=fqn
            )
        region = tuple(slice(o, o + n) for o, n in zip(start, chunk.shape, strict=True))
        glob[region] = chunk
        covered[region] += 1
    if covered.size and not np.all(covered == 1):
        raise CheckpointError(
            f"DCP tensor {fqn!r}: its chunks do not cover it exactly once", path=where, dataset=fqn
        )
    return name, glob


def tensors_of_directory(path: Path | str) -> tuple[Format, tuple[DatasetDigest, ...]] | None:
    """A DCP directory's format and its items' digests by global name, sorted; None when
    ``path`` is no DCP directory (:func:`is_dcp`). CheckpointError for one kaudit cannot
    read or cover (naming the item). See :func:`read_metadata` for its precondition."""
    root = Path(path)
    if not is_dcp(root):
        return None
    with open_dcp(root) as (meta, files):
        loaded = load_opened(meta, files)
    return Format.DCP, tuple(sorted(loaded.digests.values(), key=lambda d: d.path))


def dcp_tensors(path: Path) -> Mapping[str, Tensor]:
    """A DCP directory's tensors by path (bfloat16 read as float32), for a comparison."""
    if not is_dcp(path):
        raise CheckpointError("is a directory, not a checkpoint file (no DCP .metadata)", path=path)
    with open_dcp(path) as (meta, files):
        loaded = load_opened(meta, files, arrays=True)
    return arrays_as_tensors(loaded.arrays)


def arrays_as_tensors(arrays: Mapping[str, np.ndarray[Any, Any]]) -> Mapping[str, Tensor]:
    """Global arrays by fully qualified name, as a comparison's tensors by path."""
    return {
        tensor_path(fqn): Tensor(tensor_path(fqn), _constant(arr)) for fqn, arr in arrays.items()
    }


def _constant(arr: np.ndarray[Any, Any]) -> Callable[[], np.ndarray[Any, Any]]:
    return lambda: arr


__all__ = [
    "METADATA",
    "Loaded",
    "MetadataUnpickler",
    "arrays_as_tensors",
    "dcp_tensors",
    "is_dcp",
    "is_dcp_metadata",
    "is_spanned",
    "load_opened",
    "open_dcp",
    "read_metadata",
    "read_opened_metadata",
    "tensors_of_directory",
]
