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
(:mod:`kronos_audit.checkpoint.writer` makes that atomic,
:mod:`kronos_audit.runtime.background` asynchronous).
"""

from __future__ import annotations

import contextlib
import errno
import io
import mmap
import os
import resource
import threading
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


PLACED_MIN_BYTES = 256
"""Arrays at least this large are placed by the writer: HDF5 allocates their space and
the writer writes their bytes itself (:func:`pwrite_all`), and records where they are.
Smaller ones HDF5 writes with its metadata: an extent in a manifest would take about as
many bytes as they hold."""
RAW_MIN_BYTES = 64 * 1024
"""Arrays at least this large start at a multiple of :data:`DIRECT_ALIGN` in the file, so
that they can be written around the page cache from their own memory."""
PWRITE_BLOCK = 64 * 1024 * 1024
DIRECT_ALIGN = 4096
"""The alignment of a large array's place in the file, and of what is written to it
directly (``O_DIRECT``): a multiple of every block size Linux file systems use."""
BOUNCE_BYTES = 8 * 1024 * 1024
"""The file goes to the disk through an aligned buffer this big (its metadata, and every
array too small or not aligned in memory to be written from its own memory)."""

Flat = Mapping[str, np.ndarray[Any, Any]]
"""``/path -> array``: what a checkpoint file holds, as it is written."""


def _placed(array: np.ndarray[Any, Any]) -> bool:
    """Whether the writer places ``array`` (see :data:`PLACED_MIN_BYTES`)."""
    return (
        array.nbytes >= PLACED_MIN_BYTES
        and array.dtype.kind in "biufc"
        and array.dtype.fields is None
        and array.flags.c_contiguous
    )


def _plain_number(array: np.ndarray[Any, Any]) -> bool:
    """A number array HDF5 writes through the low-level interface: not empty, numbers
    (no strings, no fields), contiguous."""
    return (
        array.size > 0
        and array.dtype.kind in "biufc"
        and array.dtype.fields is None
        and array.flags.c_contiguous
    )


class _Creator:
    """Datasets created through HDF5's low-level interface, their groups made once each:
    h5py's ``create_dataset`` costs several times as much a dataset, and a state of
    thousands of small tensors has as many."""

    def __init__(self, f: h5py.File) -> None:
        self.f = f
        self.groups: dict[str, Any] = {"": f.id}
        self.types: dict[np.dtype[Any], Any] = {}
        # As h5py makes them: no times in object headers (the same state gives the same
        # bytes, which DVC then stores once), and names as UTF-8.
        self.written = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        self.written.set_obj_track_times(False)
        self.allocated = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        self.allocated.set_obj_track_times(False)
        self.allocated.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        self.allocated.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
        self.gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
        self.gcpl.set_obj_track_times(False)
        self.lcpl = h5py.h5p.create(h5py.h5p.LINK_CREATE)
        self.lcpl.set_char_encoding(h5py.h5t.CSET_UTF8)

    def group(self, path: str) -> Any:
        """The group ``path`` (``/a/b``; the root is ``""``), made if it is not there."""
        gid = self.groups.get(path)
        if gid is None:
            parent, _, name = path.rpartition("/")
            above = self.group(parent)
            raw = name.encode()
            if above.links.exists(raw):
                gid = h5py.h5o.open(above, raw)
            else:
                gid = h5py.h5g.create(above, raw, lcpl=self.lcpl, gcpl=self.gcpl)
            self.groups[path] = gid
        return gid

    def _space(self, array: np.ndarray[Any, Any]) -> Any:
        if array.ndim == 0:
            return h5py.h5s.create(h5py.h5s.SCALAR)
        return h5py.h5s.create_simple(array.shape)

    def _type(self, dtype: np.dtype[Any]) -> Any:
        tid = self.types.get(dtype)
        if tid is None:
            tid = self.types[dtype] = h5py.h5t.py_create(dtype, logical=True)
        return tid

    def create(self, path: str, array: np.ndarray[Any, Any], *, allocate: bool) -> Any:
        parent, _, name = path.rpartition("/")
        dcpl = self.allocated if allocate else self.written
        tid, space = self._type(array.dtype), self._space(array)
        group = self.group(parent)
        return h5py.h5d.create(group, name.encode(), tid, space, dcpl=dcpl, lcpl=self.lcpl)

    def place(self, path: str, array: np.ndarray[Any, Any]) -> int:
        """Create a contiguous dataset with its space allocated now and no fill; return
        its offset."""
        dsid = self.create(path, array, allocate=True)
        try:
            offset = dsid.get_offset()
            if offset is None or dsid.get_storage_size() != array.nbytes:
                raise CheckpointError(f"HDF5 did not allocate {path} contiguously", dataset=path)
        finally:
            # Closed now, not by the garbage collector: a file close that fails (disk
            # full) with low-level ids still open crashes h5py.
            dsid.close()
        return int(offset)

    def write(self, path: str, array: np.ndarray[Any, Any]) -> None:
        """Create a dataset and have HDF5 write ``array`` into it."""
        if not _plain_number(array):
            self.f.create_dataset(path, data=array)  # text, empty arrays, fields: h5py's
            return
        dsid = self.create(path, array, allocate=False)
        try:
            dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, array)
        finally:
            dsid.close()

    def close(self) -> None:
        for path, gid in self.groups.items():
            if path:
                gid.close()


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
    small datasets written, space for the others allocated; return (offset, array) for
    each of those, by offset (what :func:`pwrite_all` writes)."""
    return [(offset, array) for offset, _, array in lay_out_named(fd, path, flat)]


def lay_out_named(fd: int, path: Path, flat: Flat) -> list[tuple[int, str, np.ndarray[Any, Any]]]:
    """:func:`lay_out`, each array placed with its path: (offset, path, array)."""
    check_room(path, flat)
    raw: list[tuple[int, str, np.ndarray[Any, Any]]] = []
    # Large arrays start at a multiple of DIRECT_ALIGN, so that pwrite_all can write them
    # around the page cache from their own memory.
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
        creator = _Creator(f)
        stack.callback(creator.close)
        for name, array in flat.items():
            if _placed(array):
                raw.append((creator.place(name, array), name, array))
            else:
                creator.write(name, array)
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


class _Refused(Exception):
    """The file system took the ``O_DIRECT`` descriptor but refuses its writes."""


_BOUNCES: list[mmap.mmap] = []
"""Bounce buffers not in use, kept for the next file: fresh pages cost several times
what writing them does (see :mod:`kronos_audit.checkpoint.writer`)."""
_BOUNCES_LOCK = threading.Lock()
_BOUNCES_KEPT = 2


class _Image:
    """The file written in order, around the page cache, through one aligned buffer: its
    metadata (read back from what HDF5 wrote) and its arrays, copied in whole blocks; an
    array aligned in memory and in the file and as large as the buffer is written from its
    own memory instead. Each write is of whole aligned blocks at an aligned offset, the
    last partial block of the file goes through the cache (``fd``)."""

    def __init__(self, fd: int, direct: int) -> None:
        self.fd, self.direct = fd, direct
        with _BOUNCES_LOCK:
            self.bounce = _BOUNCES.pop() if _BOUNCES else mmap.mmap(-1, BOUNCE_BYTES)
        self.view = memoryview(self.bounce)
        self.start = 0  # the file offset of the buffer's first byte
        self.fill = 0  # bytes in the buffer

    def close(self) -> None:
        self.view.release()
        with _BOUNCES_LOCK:
            if len(_BOUNCES) < _BOUNCES_KEPT:
                _BOUNCES.append(self.bounce)
            else:
                self.bounce.close()

    def _write(self, data: memoryview, offset: int) -> None:
        try:
            for start in range(0, len(data), PWRITE_BLOCK):
                _pwrite(self.direct, data[start : start + PWRITE_BLOCK], offset + start)
        except OSError as e:
            if e.errno == errno.EINVAL:
                raise _Refused from None
            raise

    def flush(self) -> None:
        """Write the buffer's whole blocks; keep its last partial one at its front."""
        whole = self.fill - self.fill % DIRECT_ALIGN
        if whole:
            self._write(self.view[:whole], self.start)
            rest = self.fill - whole
            self.view[:rest] = self.view[whole : self.fill]
            self.start += whole
            self.fill = rest

    def gap(self, end: int) -> None:
        """Copy the file's own bytes (HDF5's) up to ``end`` into the buffer."""
        pos = self.start + self.fill
        while pos < end:
            if self.fill == len(self.view):
                self.flush()
            n = min(end - pos, len(self.view) - self.fill)
            got = os.preadv(self.fd, [self.view[self.fill : self.fill + n]], pos)
            if got <= 0:
                raise CheckpointError("the file is shorter than HDF5 laid it out")
            self.fill += got
            pos += got

    def array(self, data: memoryview) -> None:
        """Append an array's bytes (it starts where the buffer's content ends)."""
        offset = self.start + self.fill
        own = len(data) - len(data) % DIRECT_ALIGN
        aligned = offset % DIRECT_ALIGN == 0 and _address(data) % DIRECT_ALIGN == 0
        if own >= len(self.view) and aligned:
            self.flush()  # the buffer now ends at ``offset``, a block boundary
            assert self.fill == 0
            self._write(data[:own], offset)
            self.start = offset + own
            data = data[own:]
        done = 0
        while done < len(data):
            if self.fill == len(self.view):
                self.flush()
            n = min(len(data) - done, len(self.view) - self.fill)
            self.view[self.fill : self.fill + n] = data[done : done + n]
            self.fill += n
            done += n

    def finish(self, size: int) -> None:
        """Write what is left: whole blocks around the cache, the file's last partial
        block through it."""
        self.flush()
        if self.fill:
            _pwrite(self.fd, self.view[: self.fill], self.start)
        assert self.start + self.fill == size


def _write_image(fd: int, direct: int, raw: list[tuple[int, np.ndarray[Any, Any]]]) -> None:
    size = os.fstat(fd).st_size
    image = _Image(fd, direct)
    try:
        for offset, array in raw:
            image.gap(offset)
            image.array(array.reshape(-1).view(np.uint8).data)
        image.gap(size)
        image.finish(size)
    finally:
        image.close()


def pwrite_all(fd: int, raw: list[tuple[int, np.ndarray[Any, Any]]]) -> None:
    """Write each array of :func:`lay_out` at its offset into the file open at ``fd``,
    then fsync it.

    The file's bytes go around the page cache (``O_DIRECT``, where the file system has
    it), in large writes whatever the size of each array: a checkpoint is written once and
    read rarely, and on hosts that give freed memory back (virtual machines) every new
    file's pages in the cache are fresh memory, several times dearer to fill than the
    disk write itself; and a state of thousands of small tensors would otherwise be as
    many small writes, each waiting on the disk. The file's last partial block, and every
    byte where there is no direct write, goes through the cache; the fsync makes both
    durable."""
    direct = _direct_of(fd)
    try:
        if direct is not None:
            try:
                _write_image(fd, direct, raw)
                os.fsync(fd)
                return
            except _Refused:
                pass  # the file system takes no direct write after all: through the cache
        for offset, array in raw:
            data = array.reshape(-1).view(np.uint8).data
            for start in range(0, len(data), PWRITE_BLOCK):
                _pwrite(fd, data[start : start + PWRITE_BLOCK], offset + start)
        os.fsync(fd)
    finally:
        if direct is not None:
            os.close(direct)


def _address(data: memoryview) -> int:
    return int(np.frombuffer(data, dtype=np.uint8).ctypes.data)


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
