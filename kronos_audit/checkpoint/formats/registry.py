"""The table of format readers, and the entry points that choose one: for a file being
signed, by its content (:func:`digest_file`, :func:`tensors_of_file`); for a file being
verified, by the format its signed manifest records (:func:`digest_signed`), never by
what the file now looks like.

Readers are tried in the order registered; the first whose ``sniff`` holds reads the file.
The last, :class:`RawReader`, takes any file (a file digest only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from kronos_audit.checkpoint.formats.cf import Hdf5Reader, with_attributes
from kronos_audit.checkpoint.formats.interface import Format, FormatReader, Tensor
from kronos_audit.checkpoint.formats.npz import ZIP_MAGIC, NpyReader, NpzReader, zip_members
from kronos_audit.checkpoint.formats.safetensors import SafetensorsReader
from kronos_audit.checkpoint.hashing import (
    DatasetDigest,
    FileDigests,
    OpenFile,
    diagnose,
    digest_open,
    open_file,
)
from kronos_audit.errors import CheckpointError, UsageError

HEAD = 4096
"""Bytes of a file a reader's ``sniff`` sees."""
PICKLE_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".pkl", ".pickle")
"""Names torch, Lightning and Hugging Face give pickles."""


class PickleReader:
    """Pickles (``torch.save``, Lightning, ``pytorch_model.bin``): recognised, never read."""

    format = Format.PICKLE

    def sniff(self, name: str, head: bytes, size: int) -> bool:
        if name.endswith(PICKLE_SUFFIXES):
            return True
        return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5  # PROTO opcode

    def digests(self, opened: OpenFile) -> tuple[DatasetDigest, ...]:
        return ()

    def tensors(self, opened: OpenFile) -> Mapping[str, Tensor]:
        raise CheckpointError(
            "a pickle: kaudit never unpickles, so it has no tensors to compare", path=opened.path
        )


class RawReader:
    """Any other file: its bytes, with no tensors."""

    format = Format.BYTES

    def sniff(self, name: str, head: bytes, size: int) -> bool:
        return True

    def digests(self, opened: OpenFile) -> tuple[DatasetDigest, ...]:
        return ()

    def tensors(self, opened: OpenFile) -> Mapping[str, Tensor]:
        raise CheckpointError(
            "not an HDF5 file, nor another format kaudit reads tensors from", path=opened.path
        )


class Registry:
    """Format readers in the order they are tried, and each format's reader."""

    def __init__(self) -> None:
        self._readers: list[FormatReader] = []
        self._by_format: dict[Format, FormatReader] = {}

    def register(self, reader: FormatReader) -> None:
        """Try ``reader`` after those registered before; a format another reader already
        reads is refused with UsageError."""
        if reader.format in self._by_format:
            raise UsageError(f"format {reader.format.value!r} already has a reader")
        self._readers.append(reader)
        self._by_format[reader.format] = reader

    def reader(self, fmt: Format | str) -> FormatReader:
        """The reader of ``fmt``; CheckpointError for a format no reader reads."""
        try:
            return self._by_format[Format(fmt)]
        except (KeyError, ValueError):
            raise CheckpointError(f"format {str(fmt)[:40]!r} has no reader") from None

    def sniff(self, opened: OpenFile) -> FormatReader:
        """The first reader whose ``sniff`` holds for ``opened``."""
        view = opened.view()
        head = bytes(view[:HEAD])
        name = opened.path.name.lower()
        if head.startswith(ZIP_MAGIC) and not name.endswith(".npz"):
            # A zip is an .npz when every member is an array (torch.save's zip is a pickle).
            members = zip_members(view)
            if members and all(m.endswith(".npy") for m in members):
                return self.reader(Format.NPZ)
            if members and any(m.endswith("data.pkl") for m in members):
                return self.reader(Format.PICKLE)
        for r in self._readers:
            if r.sniff(name, head, opened.size):
                return r
        raise AssertionError("the raw reader takes any file")  # pragma: no cover


REGISTRY = Registry()
"""The readers kaudit knows, in the order they are tried."""
for _reader in (
    Hdf5Reader(),
    NpyReader(),
    NpzReader(),
    PickleReader(),
    SafetensorsReader(),
    RawReader(),
):
    REGISTRY.register(_reader)


def _tensor_digests(reader: FormatReader, opened: OpenFile) -> tuple[DatasetDigest, ...] | None:
    return reader.digests(opened) if reader.format.has_tensors else None


def tensors_of_file(path: Path | str) -> tuple[Format, tuple[DatasetDigest, ...] | None]:
    """``path``'s format, chosen by its content, and the digests of the tensors a reader of
    that format reads, sorted by path (None for a pickle or bytes: no tensors). Raises
    CheckpointError for a file of a format it cannot read or cover (naming the tensor)."""
    with open_file(path, follow_symlinks=False) as opened:
        reader = REGISTRY.sniff(opened)
        return reader.format, _tensor_digests(reader, opened)


def digest_file(
    path: Path | str,
    *,
    md5: bool = False,
    follow_symlinks: bool = True,
    name: Path | None = None,
) -> FileDigests:
    """:func:`~kronos_audit.checkpoint.hashing.digest_file` of any format: the file's
    digests, its :attr:`~FileDigests.format` and its tensors' digests (an HDF5 dataset's
    with its CF attributes). ``name``: the name the bytes are known by, when ``path`` is
    a private copy of them (snapshot's, in DVC's cache): the format is told by it, and
    messages name it."""
    with open_file(path, follow_symlinks=follow_symlinks) as opened:
        if name is not None:
            opened.path = Path(name)
        return digest_opened(opened, md5=md5)


def digest_opened(opened: OpenFile, *, md5: bool = False) -> FileDigests:
    """:func:`digest_file` of a file already open: hashed and read through ``opened``."""
    reader = REGISTRY.sniff(opened)
    digests = digest_open(opened, md5=md5)
    if reader.format is Format.HDF5:
        assert digests.datasets is not None
        datasets: tuple[DatasetDigest, ...] | None = with_attributes(opened, digests.datasets)
    else:
        datasets = _tensor_digests(reader, opened)
    return dataclasses.replace(digests, datasets=datasets, format=reader.format.value)


def digest_signed(
    opened: OpenFile,
    fmt: str | None,
    *,
    expect_sha256: str,
    recorded: tuple[DatasetDigest, ...] | None,
) -> FileDigests:
    """The digests of a file being verified, read as its signed manifest's format ``fmt``
    says (None: a manifest that predates formats, read as before: HDF5 or bytes): its
    sha256 first, its tensors after. Never raises once the sha256 is known: tensors that
    cannot be read give ``datasets`` None and the reason in ``unreadable``."""
    if fmt is None or fmt == Format.HDF5:
        digests = digest_open(opened, expect_sha256=expect_sha256, recorded=recorded)
        if fmt is None or digests.datasets is None:
            return digests
        try:
            return dataclasses.replace(digests, datasets=with_attributes(opened, digests.datasets))
        except CheckpointError as e:
            return dataclasses.replace(digests, datasets=None, unreadable=e.message)
    sha = opened.sha256(progress=False)
    datasets, unreadable = diagnose_signed(opened, fmt, recorded)
    return FileDigests(sha, opened.size, datasets, unreadable=unreadable)


def diagnose_signed(
    opened: OpenFile, fmt: str | None, recorded: tuple[DatasetDigest, ...] | None
) -> tuple[tuple[DatasetDigest, ...] | None, str | None]:
    """``(datasets, unreadable)`` of a file read as format ``fmt`` (see
    :func:`~kronos_audit.checkpoint.hashing.diagnose`), never raising."""
    if fmt is None or fmt == Format.HDF5:
        datasets, unreadable = diagnose(opened, recorded or ())
        if fmt is None or datasets is None:
            return datasets, unreadable
    try:
        reader = REGISTRY.reader(fmt)
        if fmt == Format.HDF5:
            assert datasets is not None
            return with_attributes(opened, datasets), None
        return _tensor_digests(reader, opened), None
    except CheckpointError as e:
        return None, e.message
    except MemoryError:
        return None, "out of memory reading it"
    except OSError as e:
        return None, f"cannot read it ({e.strerror or e})"


@contextmanager
def open_tensors(path: Path | str) -> Iterator[tuple[Format, Mapping[str, Tensor]]]:
    """``path``'s format and its tensors by path, to load one at a time while the file
    stays open (one descriptor: what is compared is what was opened). A directory is read
    as a torch DCP checkpoint. CheckpointError for a file with no tensors (a pickle)."""
    path = Path(path)
    if path.is_dir():
        from kronos_audit.checkpoint.formats.dcp import dcp_tensors

        yield Format.DCP, dcp_tensors(path)
        return
    with open_file(path) as opened:
        reader = REGISTRY.sniff(opened)
        yield reader.format, reader.tensors(opened)


__all__ = [
    "HEAD",
    "PICKLE_SUFFIXES",
    "REGISTRY",
    "PickleReader",
    "RawReader",
    "Registry",
    "diagnose_signed",
    "digest_file",
    "digest_opened",
    "digest_signed",
    "open_tensors",
    "tensors_of_file",
]
