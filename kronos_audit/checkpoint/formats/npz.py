""".npy and .npz files, read with numpy's own format reader and never unpickled.

An ``.npy`` is one array: a magic string, a bounded header (dtype, order, shape), then its
bytes. An ``.npz`` is a zip of ``.npy`` members (stored, or deflated by
``savez_compressed``), each named ``NAME.npy`` for the array ``NAME``. What cannot be read
without unpickling (an array of Python objects) is refused, as are members that are not
arrays, names given twice, compression other than deflate, and zip bombs: at most
:data:`MAX_MEMBERS` members, and none declaring more than :data:`DECODE_RATIO` times the
bytes the file holds (plus :data:`DECODE_SLACK`). zipfile stops each member at its
declared size and checks its CRC, so no member decodes more than it declares.
"""

from __future__ import annotations

import hashlib
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from kronos_audit.checkpoint.formats.common import BLOCK, BytesReader, tensor_path
from kronos_audit.checkpoint.formats.interface import Format, Tensor
from kronos_audit.checkpoint.hashing import DatasetDigest, array_digest, canonical_dtype, dtype_name
from kronos_audit.errors import CheckpointError

if TYPE_CHECKING:
    from kronos_audit.checkpoint.hashing import OpenFile

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"
MAX_HEADER = 10_000
"""numpy's own default bound on an .npy header, in bytes."""
MAX_MEMBERS = 100_000
"""Members of an .npz read at most."""
DECODE_RATIO = 1024
"""An .npz is read only if its members declare at most this many times the file's bytes
(plus :data:`DECODE_SLACK`): about the best deflate does on constant data."""
DECODE_SLACK = 64 * 1024 * 1024


class _Header:
    def __init__(self, fp: IO[bytes], where: Path | str, name: str) -> None:
        fmt = np.lib.format
        try:
            version = fmt.read_magic(fp)
            if version == (1, 0):
                shape, fortran, dtype = fmt.read_array_header_1_0(fp, max_header_size=MAX_HEADER)
            elif version == (2, 0):
                shape, fortran, dtype = fmt.read_array_header_2_0(fp, max_header_size=MAX_HEADER)
            else:
                raise ValueError(f"npy format version {version} is not read")
        except (ValueError, EOFError, OSError, zipfile.BadZipFile, zlib.error) as e:
            raise CheckpointError(
                f"array {name!r}: bad .npy header ({e})", path=where, dataset=name
            ) from None
        if dtype.hasobject:
            raise CheckpointError(
                f"array {name!r} holds Python objects: reading them would unpickle, refused",
                path=where,
                dataset=name,
            )
        self.shape: tuple[int, ...] = tuple(int(d) for d in shape)
        self.fortran = bool(fortran)
        self.dtype: np.dtype[Any] = dtype
        self.nbytes = int(np.prod(self.shape, dtype=object)) * dtype.itemsize

    @property
    def raw_is_canonical(self) -> bool:
        """Whether the stored bytes are the canonical ones (C order, little-endian)."""
        return (not self.fortran or len(self.shape) < 2) and canonical_dtype(
            self.dtype
        ) == self.dtype


def _digest(fp: IO[bytes], path: str, where: Path | str, name: str) -> DatasetDigest:
    head = _Header(fp, where, name)
    if not head.raw_is_canonical:
        return array_digest(path, _read(fp, head, where, name))
    h = hashlib.sha256()
    left = head.nbytes
    try:
        while left:
            block = fp.read(min(BLOCK, left))
            if not block:
                break
            h.update(block)
            left -= len(block)
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise CheckpointError(
            f"array {name!r}: cannot read it ({e})", path=where, dataset=name
        ) from None
    if left:
        raise CheckpointError(f"array {name!r} ends {left:,} bytes early", path=where, dataset=name)
    return DatasetDigest(path, dtype_name(head.dtype), head.shape, h.hexdigest())


def _read(fp: IO[bytes], head: _Header, where: Path | str, name: str) -> np.ndarray[Any, Any]:
    try:
        data = fp.read(head.nbytes)
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise CheckpointError(
            f"array {name!r}: cannot read it ({e})", path=where, dataset=name
        ) from None
    if len(data) != head.nbytes:
        raise CheckpointError(f"array {name!r} ends early", path=where, dataset=name)
    flat = np.frombuffer(data, dtype=head.dtype)
    return flat.reshape(head.shape, order="F" if head.fortran else "C")


class NpyReader:
    """The reader of one ``.npy`` array (its tensor is ``/`` plus the file's stem)."""

    format = Format.NPY

    def sniff(self, name: str, head: bytes, size: int) -> bool:
        return head.startswith(NPY_MAGIC)

    def _name(self, opened: OpenFile) -> str:
        return opened.path.name.removesuffix(".npy")

    def digests(self, opened: OpenFile) -> tuple[DatasetDigest, ...]:
        name = self._name(opened)
        fp = BytesReader(opened.view())
        digest = _digest(fp, tensor_path(name), opened.path, name)  # type: ignore[arg-type]
        if fp.tell() != opened.size:
            raise CheckpointError(
                f"{opened.size - fp.tell():,} bytes after the array: not an .npy file numpy wrote",
                path=opened.path,
            )
        return (digest,)

    def tensors(self, opened: OpenFile) -> Mapping[str, Tensor]:
        name = self._name(opened)
        view = opened.view()

        def load() -> np.ndarray[Any, Any]:
            fp = BytesReader(view)
            head = _Header(fp, opened.path, name)  # type: ignore[arg-type]
            flat = np.frombuffer(
                view, head.dtype, count=head.nbytes // max(1, head.dtype.itemsize), offset=fp.tell()
            )
            return flat.reshape(head.shape, order="F" if head.fortran else "C")

        return {tensor_path(name): Tensor(tensor_path(name), load)}


@contextmanager
def _members(opened: OpenFile) -> Iterator[tuple[zipfile.ZipFile, dict[str, zipfile.ZipInfo]]]:
    """The open zip and its array members by array name, checked against the bounds."""
    where = opened.path
    try:
        zf = zipfile.ZipFile(BytesReader(opened.view()))
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise CheckpointError(f"not a readable .npz (zip) file ({e})", path=where) from None
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS:
            raise CheckpointError(
                f".npz of {len(infos):,} members refused (at most {MAX_MEMBERS:,})", path=where
            )
        declared = sum(i.file_size for i in infos)
        if declared > DECODE_RATIO * opened.size + DECODE_SLACK:
            raise CheckpointError(
                f".npz members declare {declared:,} bytes from a file of {opened.size:,}: a zip "
                f"bomb, not read (at most {DECODE_RATIO:,} times the file, plus "
                f"{DECODE_SLACK // (1024 * 1024)} MiB)",
                path=where,
            )
        members: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            if not info.filename.endswith(".npy") or info.is_dir():
                raise CheckpointError(
                    f".npz member {info.filename!r} is not an .npy array", path=where
                )
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise CheckpointError(
                    f".npz member {info.filename!r}: compression {info.compress_type} is not read",
                    path=where,
                )
            name = info.filename.removesuffix(".npy")
            if name in members:
                raise CheckpointError(f".npz names array {name!r} twice", path=where, dataset=name)
            members[name] = info
        yield zf, members


class NpzReader:
    """The reader of numpy's ``.npz`` zip of arrays."""

    format = Format.NPZ

    def sniff(self, name: str, head: bytes, size: int) -> bool:
        return head.startswith(ZIP_MAGIC) and name.endswith(".npz")

    def digests(self, opened: OpenFile) -> tuple[DatasetDigest, ...]:
        out = []
        with _members(opened) as (zf, members):
            for name, info in sorted(members.items()):
                try:
                    with zf.open(info) as fp:
                        out.append(_digest(fp, tensor_path(name), opened.path, name))
                except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError) as e:
                    raise CheckpointError(
                        f"array {name!r}: cannot read it ({e})", path=opened.path, dataset=name
                    ) from None
        return tuple(out)

    def tensors(self, opened: OpenFile) -> Mapping[str, Tensor]:
        with _members(opened) as (_, members):
            names = sorted(members)

        def loader(name: str) -> Any:
            def load() -> np.ndarray[Any, Any]:
                with _members(opened) as (zf, found):
                    try:
                        with zf.open(found[name]) as fp:
                            return _read(fp, _Header(fp, opened.path, name), opened.path, name)
                    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError) as e:
                        raise CheckpointError(
                            f"array {name!r}: cannot read it ({e})", path=opened.path, dataset=name
                        ) from None

            return load

        return {tensor_path(n): Tensor(tensor_path(n), loader(n)) for n in names}


def zip_members(head_view: memoryview) -> list[str] | None:
    """The member names of a zip's bytes (None if it is not a readable zip), bounded by
    :data:`MAX_MEMBERS`: to tell an .npz from another zip (torch.save's) by content."""
    try:
        with zipfile.ZipFile(BytesReader(head_view)) as zf:
            infos = zf.infolist()
            return [i.filename for i in infos[: MAX_MEMBERS + 1]]
    except (zipfile.BadZipFile, ValueError, OSError, EOFError):
        return None


__all__ = ["NPY_MAGIC", "ZIP_MAGIC", "NpyReader", "NpzReader", "zip_members"]
