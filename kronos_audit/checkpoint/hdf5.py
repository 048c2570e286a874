"""The flat HDF5 layout: ``{dataset path: value}``, and plain state laid out that way.

Every reader of a checkpoint's datasets shares these: :func:`read_flat` and
:func:`read_group` read the datasets under a group back (arrays, numpy scalars for 0-d
datasets, ``str`` for 0-d strings), :func:`text_array` is how a ``str`` is stored, and
:func:`flatten` / :func:`unflatten` turn nested string-keyed dicts into paths and back:
``{"fields": {"u": array}, "t": 0.5}`` is stored as datasets ``/fields/u`` and ``/t``.
Python and numpy scalars become 0-d datasets and come back as numpy scalars; strings
become fixed-length UTF-8 strings and come back as ``str``. The Monte Carlo ledger's
results use this layout as it is; a run's state goes through
:mod:`kronos_audit.checkpoint.codec.tree`, which lays plain dicts out the same way and keeps
every other type (tensors, lists, int keys ...) with a record of the structure.
:func:`write_hdf5` writes a flat state to a new file, its large arrays with ``os.pwrite``
(:mod:`kronos_audit.checkpoint.writer` makes that atomic and asynchronous).
"""

from __future__ import annotations

import contextlib
import errno
import io
import mmap
import os
import resource
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from kronos_audit.errors import CheckpointError, UsageError

State = dict[str, Any]


def text_array(text: str) -> np.ndarray[Any, Any]:
    """A 0-d fixed-length UTF-8 string array: what a ``str`` in the state is stored as.

    Fixed, not variable, length: h5py crashes the process when closing a file whose final
    write fails (disk full, quota) while it holds variable-length strings.
    """
    data = text.encode()
    return np.array(data, dtype=h5py.string_dtype("utf-8", max(1, len(data))))


def type_name(value: object) -> str:
    """How an error names the type of ``value``: ``None``, or the class's own name
    (``ndarray``, ``list``), never ``NoneType``."""
    return "None" if value is None else type(value).__name__


def a_type(value: object) -> str:
    """:func:`type_name` with its article: ``None``, ``a list``, ``an object``."""
    if value is None:
        return "None"
    name = type_name(value)
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def require_mapping(state: object) -> None:
    """Refuse a state that is not a mapping of names to values, in one line."""
    if not isinstance(state, Mapping):
        raise UsageError(f"state must be a mapping of names to arrays, got {type_name(state)}")


def flatten(state: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray[Any, Any]]:
    """``/path -> array`` for every leaf; raise UsageError for what HDF5 cannot hold."""
    if not prefix:
        require_mapping(state)
    out: dict[str, np.ndarray[Any, Any]] = {}
    for key, value in state.items():
        if not isinstance(key, str) or not key or "/" in key or key in (".", ".."):
            raise UsageError(f"state key {prefix}/{key!r}: keys are non-empty strings without '/'")
        path = f"{prefix}/{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, path))
        elif isinstance(value, str):
            out[path] = text_array(value)
        elif isinstance(value, np.ndarray | np.generic | int | float | bool | complex):
            array = np.asarray(value)
            if array.dtype.hasobject or array.dtype.kind in "UMm":
                raise UsageError(
                    f"state {path}: dtype {array.dtype} cannot be stored; use numbers or bytes"
                )
            out[path] = array
        else:
            raise UsageError(
                f"state {path}: {a_type(value)} cannot be stored; "
                "use numpy arrays, numbers, strings or nested dicts of them"
            )
    return out


def unflatten(flat: Mapping[str, Any]) -> State:
    root: State = {}
    for path, value in flat.items():
        parts = path.strip("/").split("/")
        node = root
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return root


RAW_MIN_BYTES = 64 * 1024
"""Arrays at least this large go through pwrite; smaller ones are not worth the detour."""
PWRITE_BLOCK = 64 * 1024 * 1024
DIRECT_ALIGN = 4096
"""The alignment of a large array's place in the file, and of what is written to it
directly (``O_DIRECT``): a multiple of every block size Linux file systems use."""
BOUNCE_BYTES = 8 * 1024 * 1024
"""An array not aligned in memory goes to the disk through an aligned buffer this big."""

Flat = Mapping[str, np.ndarray[Any, Any]]
"""``/path -> array``: what a checkpoint file holds, as it is written."""


def _raw_writable(array: np.ndarray[Any, Any]) -> bool:
    return (
        array.nbytes >= RAW_MIN_BYTES
        and array.ndim > 0
        and array.dtype.kind in "biufc"
        and array.dtype.fields is None
        and array.flags.c_contiguous
    )


def _create_allocated(f: h5py.File, path: str, array: np.ndarray[Any, Any]) -> int:
    """Create a contiguous dataset with its space allocated now and no fill; return its offset."""
    parent, _, name = path.rpartition("/")
    group = f.require_group(parent or "/")
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    tid = h5py.h5t.py_create(array.dtype, logical=True)
    sid = h5py.h5s.create_simple(array.shape)
    dsid = h5py.h5d.create(group.id, name.encode(), tid, sid, dcpl=dcpl)
    try:
        offset = dsid.get_offset()
        if offset is None or dsid.get_storage_size() != array.nbytes:
            raise CheckpointError(f"HDF5 did not allocate {path} contiguously", dataset=path)
    finally:
        # Closed now, not by the garbage collector: a file close that fails (disk full)
        # with low-level ids still open crashes h5py.
        dsid.close()
    return int(offset)


METADATA_MARGIN = 1024 * 1024
"""Room assumed for HDF5's own structures when checking space before a write."""


def check_room(path: Path, flat: Flat) -> None:
    """Refuse a write that cannot fit: free space on the file system, and the process's
    file-size limit. HDF5 writes its last metadata when the file closes, and a write that
    fails there can crash h5py, so the common causes are caught before HDF5 starts."""
    needed = sum(a.nbytes for a in flat.values()) + METADATA_MARGIN
    st = os.statvfs(path.parent)
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    if needed > free:
        raise CheckpointError(
            f"not enough space: the checkpoint needs about {needed:,} bytes, {free:,} are free",
            path=path,
        )
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit != resource.RLIM_INFINITY and needed > limit:
        raise CheckpointError(
            f"File too large: the checkpoint needs about {needed:,} bytes, the process may "
            f"write files of at most {limit:,} (ulimit -f)",
            path=path,
        )


def create_file(path: Path, *, exclusive: bool = True) -> int:
    """A read-write descriptor of a new file at ``path``, created here: never through a
    symbolic link and, ``exclusive``, never an existing file (else one is emptied). The
    writer lays out, hashes and writes the file through this descriptor alone
    (:func:`lay_out_named`, :func:`pwrite_all`): a file another writer renames over the
    name meanwhile is neither read nor written, so it cannot end up in what is signed.
    Raises OSError."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= os.O_EXCL if exclusive else os.O_TRUNC
    # An OSError as h5py's own create raised it: the writer's callers say what it means.
    return os.open(path, flags, 0o666)


def lay_out(fd: int, path: Path, flat: Flat) -> list[tuple[int, np.ndarray[Any, Any]]]:
    """Lay the file open at ``fd`` (``path``, for messages) out with h5py: metadata and
    small datasets written, space for the large ones allocated; return (offset, array) for
    each large one, by offset."""
    return [(offset, array) for offset, _, array in lay_out_named(fd, path, flat)]


def lay_out_named(fd: int, path: Path, flat: Flat) -> list[tuple[int, str, np.ndarray[Any, Any]]]:
    """:func:`lay_out`, each large array with its path: (offset, path, array)."""
    check_room(path, flat)
    raw: list[tuple[int, str, np.ndarray[Any, Any]]] = []
    # Large arrays start at a multiple of DIRECT_ALIGN, so that pwrite_all can write them
    # around the page cache.
    aligned = {"alignment_threshold": RAW_MIN_BYTES, "alignment_interval": DIRECT_ALIGN}
    # HDF5 writes into the file the descriptor holds, never into whatever the name holds:
    # it opens /proc/self/fd/N, which is that file wherever its name now points (HDF5's
    # own C driver, as fast as opening the name); without /proc, through the descriptor
    # itself (h5py's file-object driver: each of HDF5's reads and writes a Python call).
    # Unbuffered either way: what HDF5 wrote is in the file once it closes, for the
    # hashing that reads it back with pread.
    # No HDF5 file lock (an flock): the file is this writer's own until it is renamed into
    # place, so the lock keeps no one out, and a child forked while it is held would keep
    # it on what becomes the step's file, refusing every reader that locks (h5py's default)
    # for as long as that child lives.
    with contextlib.ExitStack() as stack:
        proc = _proc_fd(fd)
        target: str | io.FileIO = (
            proc if proc is not None else stack.enter_context(io.FileIO(fd, "r+", closefd=False))
        )
        f = stack.enter_context(h5py.File(target, "w", locking=False, **aligned))
        for name, array in flat.items():
            if _raw_writable(array):
                raw.append((_create_allocated(f, name, array), name, array))
            else:
                f.create_dataset(name, data=array)
    return sorted(raw, key=lambda r: r[0])


def _proc_fd(fd: int) -> str | None:
    """``/proc/self/fd/N`` for descriptor ``fd`` when it names that very file (Linux's
    /proc mounted), else None."""
    proc = f"/proc/self/fd/{fd}"
    try:
        same = os.path.samestat(os.stat(proc), os.fstat(fd))
    except OSError:
        return None
    return proc if same else None


def _pwrite(fd: int, data: memoryview, offset: int) -> None:
    written = 0
    while written < len(data):
        written += os.pwrite(fd, data[written:], offset + written)


def _open_direct(path: Path | str) -> int | None:
    """A second descriptor of ``path`` that writes around the page cache (``O_DIRECT``);
    None where the file system has none (tmpfs, some network file systems)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | flag)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOENT):
            return None
        raise


def _direct_of(fd: int) -> int | None:
    """:func:`_open_direct` of the file open at ``fd``, never of a name: Linux's
    ``/proc/self/fd/N`` opens the very file the descriptor holds, wherever its name now
    points; None without it."""
    proc = _proc_fd(fd)
    return None if proc is None else _open_direct(proc)


class _Direct:
    """Writes of whole aligned blocks through an ``O_DIRECT`` descriptor, from the array's
    own memory when it is aligned, else through one aligned buffer; any write the file
    system refuses (EINVAL) turns it off, and the caller writes the bytes the usual way."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self._bounce: mmap.mmap | None = None

    def write(self, data: memoryview, offset: int) -> int:
        """Write the longest aligned prefix of ``data`` at ``offset`` (aligned); return
        how many bytes were written (0 when direct writing is off)."""
        length = len(data) - len(data) % DIRECT_ALIGN
        if self.fd is None or length == 0 or offset % DIRECT_ALIGN:
            return 0
        try:
            if _address(data) % DIRECT_ALIGN == 0:
                for start in range(0, length, PWRITE_BLOCK):
                    stop = min(start + PWRITE_BLOCK, length)
                    _pwrite(self.fd, data[start:stop], offset + start)
            else:
                if self._bounce is None:
                    self._bounce = mmap.mmap(-1, BOUNCE_BYTES)
                bounce = memoryview(self._bounce)
                try:
                    for start in range(0, length, BOUNCE_BYTES):
                        n = min(BOUNCE_BYTES, length - start)
                        bounce[:n] = data[start : start + n]
                        _pwrite(self.fd, bounce[:n], offset + start)
                finally:
                    bounce.release()
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self.close()  # the file system takes no direct write after all
            return 0
        return length

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self._bounce is not None:
            self._bounce.close()
            self._bounce = None


def _address(data: memoryview) -> int:
    return int(np.frombuffer(data, dtype=np.uint8).ctypes.data)


def pwrite_all(fd: int, raw: list[tuple[int, np.ndarray[Any, Any]]]) -> None:
    """Write each large array of :func:`lay_out` at its offset into the file open at
    ``fd``, then fsync it.

    The arrays' aligned bytes go around the page cache (``O_DIRECT``, where the file
    system has it): a checkpoint is written once and read rarely, and on hosts that give
    freed memory back (virtual machines) every new file's pages in the cache are fresh
    memory, several times dearer to fill than the disk write itself. What is not aligned
    (an array's last partial block), and every byte where there is no direct write, goes
    through the cache; the fsync makes both durable."""
    direct = _Direct(_direct_of(fd))
    try:
        for offset, array in raw:
            data = array.reshape(-1).view(np.uint8).data
            done = direct.write(data, offset)
            for start in range(done, len(data), PWRITE_BLOCK):
                _pwrite(fd, data[start : start + PWRITE_BLOCK], offset + start)
        os.fsync(fd)
    finally:
        direct.close()


def write_hdf5(path: Path, flat: Flat) -> None:
    """Write ``/path -> array`` to a new HDF5 file and fsync it (not atomic by itself;
    an existing file at ``path`` is replaced, a symbolic link refused)."""
    fd = create_file(path, exclusive=False)
    try:
        pwrite_all(fd, lay_out(fd, path, flat))
    finally:
        os.close(fd)


def _value(dset: h5py.Dataset) -> Any:
    if h5py.check_string_dtype(dset.dtype) is not None and dset.shape == ():
        try:
            return dset.asstr()[()]
        except UnicodeDecodeError:
            raise CheckpointError(
                f"dataset {dset.name}: not UTF-8 text", dataset=dset.name
            ) from None
    return dset[()]  # an array, or a numpy scalar for a 0-d dataset


def read_group(path: Path, group: str = "/", *, exclude: tuple[str, ...] = ()) -> State:
    """The datasets under ``group`` as a nested dict (names in ``exclude`` skipped at top)."""
    return unflatten(read_flat(path, group, exclude=exclude))


def read_flat(path: Path, group: str = "/", *, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """``/path -> value`` for the datasets under ``group`` (names in ``exclude`` skipped at
    top): arrays, numpy scalars for 0-d datasets, ``str`` for 0-d strings."""
    flat: dict[str, Any] = {}
    try:
        with h5py.File(path, "r") as f:
            base = f[group]

            def visit(name: str, obj: object) -> None:
                if isinstance(obj, h5py.Dataset) and name.split("/")[0] not in exclude:
                    flat["/" + name] = _value(obj)

            base.visititems(visit)
    except (OSError, KeyError) as e:
        raise CheckpointError(f"cannot read state: {e}", path=path) from None
    except CheckpointError as e:
        raise CheckpointError(e.message, path=path, dataset=e.dataset) from None
    return flat
