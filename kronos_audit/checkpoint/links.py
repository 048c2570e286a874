"""Every name a reader can use in an HDF5 file, each with the dataset it reads.

The digests cover what a reader reads by every name: :func:`list_datasets` walks every
link (hard-link aliases, soft links, soft links to groups above) one link at a time and
refuses what a reader would read from outside the file's bytes (external links, external
raw storage, virtual datasets, references, dangling soft links, groups that contain
themselves) with a :class:`~kronos_audit.errors.CheckpointError` naming the HDF5 path.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from kronos_audit.errors import CheckpointError

MAX_NAMES = 1_000_000
"""Most links walked in one file. A group reachable by several names multiplies the names
below it; a file past this many is refused rather than walked for ever (a manifest of that
many datasets would be beyond what kaudit reads anyway)."""
SOFT_LINKS = 16
"""Most soft links followed to resolve one name, as HDF5 counts them (its default
``H5L_NUM_LINKS``): a reader's h5py gives up there too."""
MAX_DEPTH = 200
"""Deepest nesting of groups walked; a deeper file is refused rather than recursed into."""


class _Refused(Exception):
    """A name a reader can use whose content the digests cannot cover."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where = where


_EFL_MESSAGE = 1 << 7
"""The bit of an object header's message types that says it has an External File List
message (type 0x0007): HDF5 reads such a dataset's raw data from other files."""


class Found:
    """A dataset the walk found, read through HDF5's low-level interface: what the digests
    ask of every dataset is read once, here, without h5py's high-level objects (which
    cost more than the rest together, per dataset, in a state of thousands of small
    tensors); :attr:`dataset` is that object, made only for a dataset read through h5py."""

    __slots__ = ("_dataset", "_dtype", "_shape", "id", "name", "offset", "type")

    def __init__(self, dsid: h5py.h5d.DatasetID, name: str, stored: h5py.h5t.TypeID) -> None:
        self.id = dsid
        """Its HDF5 identifier."""
        self.name = name
        """The first name the walk found it by."""
        self.type = stored
        """Its stored HDF5 type."""
        self.offset: int | None = dsid.get_offset()
        """Where its raw data starts in the file: None unless it is stored contiguous in
        the file and allocated (HDF5 gives none for chunked, compact, virtual and
        external storage)."""
        self._dtype: np.dtype[Any] | None = None
        self._shape: tuple[int, ...] | bool | None = False
        self._dataset: h5py.Dataset | None = None

    @property
    def dtype(self) -> np.dtype[Any]:
        """Its numpy dtype, as h5py reads it."""
        if self._dtype is None:
            self._dtype = self.type.dtype
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...] | None:
        """Its shape; None for an empty (null) dataspace."""
        if self._shape is False:
            self._shape = self.id.get_space().shape
        return self._shape  # type: ignore[return-value]

    @property
    def size(self) -> int:
        """Its number of elements (0 for a null dataspace)."""
        shape = self.shape
        return 0 if shape is None else math.prod(shape)

    @property
    def dataset(self) -> h5py.Dataset:
        """h5py's object for it, to read it through h5py."""
        if self._dataset is None:
            self._dataset = h5py.Dataset(self.id, readonly=True)
        return self._dataset


@dataclass
class _Listing:
    """Every dataset reachable in one file, once per object, with each name that reads it."""

    root: Any
    """The file's root group (HDF5's identifier)."""
    objects: dict[Any, tuple[Found, list[str]]]
    """Object identity -> (the dataset, every absolute name that reads it)."""
    walked: int = 0
    """Links walked so far (bounded by MAX_NAMES)."""
    followed: int = 0
    """Soft links followed while resolving the current name (bounded by SOFT_LINKS)."""

    def walk(self, group: Any, prefix: str, ancestors: tuple[Any, ...]) -> None:
        if len(ancestors) > MAX_DEPTH:
            raise _Refused(prefix, f"groups nested more than {MAX_DEPTH} deep")
        names: list[bytes] = []
        group.links.iterate(names.append)
        for raw in names:
            self.walked += 1
            if self.walked > MAX_NAMES:
                raise _Refused(
                    prefix or "/",
                    f"more than {MAX_NAMES:,} names (groups reachable by several names "
                    "multiply them): too many to list in a manifest",
                )
            try:
                name = prefix + "/" + raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _Refused(prefix or "/", f"a link name that is not UTF-8: {raw!r}") from None
            self.followed = 0
            self.add(name, self.open_link(group, raw, name), ancestors)

    def add(self, name: str, oid: Any, ancestors: tuple[Any, ...]) -> None:
        kind = h5py.h5i.get_type(oid)
        if kind == h5py.h5i.GROUP:
            key = _identity(oid)
            if key in ancestors:
                raise _Refused(
                    name,
                    "leads back to a group that contains it: a reader has endless names for "
                    "what is below, which the manifest cannot list",
                )
            self.walk(oid, name, (*ancestors, key))
        elif kind == h5py.h5i.DATASET:
            info = h5py.h5o.get_info(oid)
            key = (info.fileno, info.addr)
            entry = self.objects.get(key)
            if entry is None:
                found = _checked(oid, name, info)
                self.objects[key] = (found, [name])
            else:  # a second name for a dataset already checked: hashed once, listed twice
                entry[1].append(name)
        # A committed datatype holds no data for a reader to read.

    def open_link(self, group: Any, raw: bytes, name: str) -> Any:
        """The low-level identifier of what the link ``raw`` in ``group`` leads to,
        resolved one link at a time so that an external link is refused before HDF5
        could open the file it names."""
        kind = group.links.get_info(raw).type
        if kind == h5py.h5l.TYPE_HARD:
            return h5py.h5o.open(group, raw)
        if kind == h5py.h5l.TYPE_EXTERNAL:
            filename, target = group.links.get_val(raw)
            raise _Refused(
                name,
                f"external link to {_text(filename)}:{_text(target)}: a reader would read "
                "another file, which the manifest cannot cover",
            )
        if kind != h5py.h5l.TYPE_SOFT:
            raise _Refused(
                name,
                "a user-defined link: what a reader gets there depends on code outside the "
                "file, which the manifest cannot cover",
            )
        target = group.links.get_val(raw)
        # Counted over the whole resolution, as HDF5 does: soft links whose targets name
        # other soft links could otherwise make the work grow exponentially.
        self.followed += 1
        if self.followed > SOFT_LINKS:
            raise _Refused(name, f"more than {SOFT_LINKS} soft links to follow (a loop?)")
        node: Any = self.root if target.startswith(b"/") else group
        for part in target.split(b"/"):
            if part in (b"", b"."):
                continue
            is_group = h5py.h5i.get_type(node) == h5py.h5i.GROUP
            if not is_group or not node.links.exists(part):
                raise _Refused(
                    name,
                    f"dangling soft link to {_text(target)}: it names nothing in this file, so "
                    "what a reader gets there cannot be covered",
                )
            node = self.open_link(node, part, name)
        return node


def _identity(oid: Any) -> tuple[int, int]:
    """What tells one HDF5 object from another in a file, whatever name opened it."""
    info = h5py.h5o.get_info(oid)
    return info.fileno, info.addr


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


def _checked(dsid: Any, name: str, info: Any) -> Found:
    """The dataset ``dsid``, refused if a reader would take its values from outside the
    hashed bytes."""
    found = Found(dsid, name, dsid.get_type())
    # The creation properties cost more than the rest of a dataset's checks: they are
    # read only when HDF5 gives no address for the data (chunked, compact, virtual,
    # external, unallocated) or the header has an external file list (whatever address
    # it also claims), never for the common contiguous dataset.
    if found.offset is None or _has_external_list(info):
        dcpl = dsid.get_create_plist()
        if dcpl.get_layout() == h5py.h5d.VIRTUAL:
            raise _Refused(
                name,
                "a virtual dataset: a reader would read other datasets or files, which the "
                "manifest cannot cover",
            )
        if dcpl.get_external_count():
            dset = found.dataset
            files = ", ".join(sorted({_text(os.fsencode(e[0])) for e in dset.external or ()}))
            raise _Refused(
                name,
                f"raw data stored outside the file (in {files}): a reader would read those "
                "bytes, which the manifest cannot cover",
            )
    kind = found.type.get_class()
    nested = kind in (h5py.h5t.COMPOUND, h5py.h5t.ARRAY, h5py.h5t.VLEN)
    if kind == h5py.h5t.REFERENCE or (nested and found.type.detect_class(h5py.h5t.REFERENCE)):
        raise _Refused(
            name,
            "holds object or region references: a reader would follow them to data that "
            "this dataset's digest cannot cover",
        )
    return found


def _has_external_list(info: Any) -> bool:
    """Whether an object's header (``info``, h5py's object info) has an external file
    list; True when the header cannot say."""
    try:
        return bool(info.hdr.mesg.present & _EFL_MESSAGE)
    except AttributeError:
        return True


def list_datasets(f: h5py.File, path: Path) -> dict[Any, tuple[Found, list[str]]]:
    """Every dataset reachable from the root by any name, each with all its names.

    Hard-link aliases get one name each; a soft link gets its own name for what it
    resolves to; a soft link to a group covers everything below it under the link's name,
    as a reader sees it. Refused (CheckpointError naming the HDF5 path): external links,
    user-defined links, dangling soft links, groups that contain themselves, virtual
    datasets, external raw storage, reference types.
    """
    root = h5py.h5o.open(f.id, b"/")
    listing = _Listing(root, {})
    try:
        listing.walk(root, "", (_identity(root),))
    except _Refused as e:
        raise CheckpointError(str(e), path=path, dataset=e.where) from None
    return listing.objects
