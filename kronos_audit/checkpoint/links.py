"""Every name a reader can use in an HDF5 file, each with the dataset it reads.

The digests cover what a reader reads by every name: :func:`list_datasets` walks every
link (hard-link aliases, soft links, soft links to groups above) one link at a time and
refuses what a reader would read from outside the file's bytes (external links, external
raw storage, virtual datasets, references, dangling soft links, groups that contain
themselves) with a :class:`~kronos_audit.errors.CheckpointError` naming the HDF5 path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py

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


@dataclass
class _Listing:
    """Every dataset reachable in one file, once per object, with each name that reads it."""

    f: h5py.File
    """The open file."""
    objects: dict[Any, tuple[h5py.Dataset, list[str]]]
    """Object id -> (the dataset, every absolute name that reads it)."""
    walked: int = 0
    """Links walked so far (bounded by MAX_NAMES)."""
    followed: int = 0
    """Soft links followed while resolving the current name (bounded by SOFT_LINKS)."""

    def walk(self, group: h5py.Group, prefix: str, ancestors: tuple[Any, ...]) -> None:
        if len(ancestors) > MAX_DEPTH:
            raise _Refused(prefix, f"groups nested more than {MAX_DEPTH} deep")
        names: list[bytes] = []
        group.id.links.iterate(names.append)
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

    def add(self, name: str, obj: object, ancestors: tuple[Any, ...]) -> None:
        if isinstance(obj, h5py.Group):
            if obj.id in ancestors:
                raise _Refused(
                    name,
                    "leads back to a group that contains it: a reader has endless names for "
                    "what is below, which the manifest cannot list",
                )
            self.walk(obj, name, (*ancestors, obj.id))
        elif isinstance(obj, h5py.Dataset):
            entry = self.objects.get(obj.id)
            if entry is None:
                _check_dataset(obj, name)
                self.objects[obj.id] = (obj, [name])
            else:  # a second name for a dataset already checked: hashed once, listed twice
                entry[1].append(name)
        # A committed datatype holds no data for a reader to read.

    def open_link(self, group: h5py.Group, raw: bytes, name: str) -> object:
        """What the link ``raw`` in ``group`` leads to, resolved one link at a time so that
        an external link is refused before HDF5 could open the file it names."""
        kind = group.id.links.get_info(raw).type
        if kind == h5py.h5l.TYPE_HARD:
            return _wrap(h5py.h5o.open(group.id, raw))
        if kind == h5py.h5l.TYPE_EXTERNAL:
            filename, target = group.id.links.get_val(raw)
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
        target = group.id.links.get_val(raw)
        # Counted over the whole resolution, as HDF5 does: soft links whose targets name
        # other soft links could otherwise make the work grow exponentially.
        self.followed += 1
        if self.followed > SOFT_LINKS:
            raise _Refused(name, f"more than {SOFT_LINKS} soft links to follow (a loop?)")
        node: object = self.f if target.startswith(b"/") else group
        for part in target.split(b"/"):
            if part in (b"", b"."):
                continue
            if not isinstance(node, h5py.Group) or not node.id.links.exists(part):
                raise _Refused(
                    name,
                    f"dangling soft link to {_text(target)}: it names nothing in this file, so "
                    "what a reader gets there cannot be covered",
                )
            node = self.open_link(node, part, name)
        return node


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


def _wrap(oid: Any) -> object:
    kind = h5py.h5i.get_type(oid)
    if kind == h5py.h5i.GROUP:
        return h5py.Group(oid)
    if kind == h5py.h5i.DATASET:
        return h5py.Dataset(oid, readonly=True)
    return None


def _check_dataset(dset: h5py.Dataset, name: str) -> None:
    """Refuse a dataset whose values a reader would take from outside the hashed bytes."""
    if dset.is_virtual:
        raise _Refused(
            name,
            "a virtual dataset: a reader would read other datasets or files, which the "
            "manifest cannot cover",
        )
    if dset.external:
        files = ", ".join(sorted({_text(os.fsencode(e[0])) for e in dset.external}))
        raise _Refused(
            name,
            f"raw data stored outside the file (in {files}): a reader would read those "
            "bytes, which the manifest cannot cover",
        )
    if dset.id.get_type().detect_class(h5py.h5t.REFERENCE):
        raise _Refused(
            name,
            "holds object or region references: a reader would follow them to data that "
            "this dataset's digest cannot cover",
        )


def list_datasets(f: h5py.File, path: Path) -> dict[Any, tuple[h5py.Dataset, list[str]]]:
    """Every dataset reachable from the root by any name, each with all its names.

    Hard-link aliases get one name each; a soft link gets its own name for what it
    resolves to; a soft link to a group covers everything below it under the link's name,
    as a reader sees it. Refused (CheckpointError naming the HDF5 path): external links,
    user-defined links, dangling soft links, groups that contain themselves, virtual
    datasets, external raw storage, reference types.
    """
    listing = _Listing(f, {})
    try:
        listing.walk(f, "", (f.id,))
    except _Refused as e:
        raise CheckpointError(str(e), path=path, dataset=e.where) from None
    return listing.objects
