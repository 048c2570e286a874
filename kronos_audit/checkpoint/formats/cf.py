"""HDF5 and NetCDF-4 files: the datasets :mod:`~kronos_audit.checkpoint.hashing` digests,
with the attributes that change what a reader computes from them (the CF conventions'
packing, fill values and units), and the values a CF reader such as xarray computes.

A CF-packed variable stores integers a reader turns into ``value * scale_factor +
add_offset``, with elements equal to ``_FillValue`` or ``missing_value`` masked (NaN): a
doubled ``scale_factor`` changes every value read while the stored bytes stay equal. So
each dataset's digest carries the digests of those attributes it has
(:data:`CF_ATTRIBUTES`), and a comparison of a packed variable compares the unpacked
values, as xarray's ``decode_cf`` reads them.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from kronos_audit.checkpoint.formats.interface import Format, Tensor
from kronos_audit.checkpoint.hashing import (
    HDF5_SIGNATURE,
    DatasetDigest,
    array_digest,
    diagnose,
)
from kronos_audit.errors import CheckpointError

if TYPE_CHECKING:
    from kronos_audit.checkpoint.hashing import OpenFile

CF_ATTRIBUTES = (
    "scale_factor",
    "add_offset",
    "_FillValue",
    "missing_value",
    "_Unsigned",
    "units",
    "calendar",
)
"""The attributes hashed with their dataset: CF's packing, masking, signedness and the
units and calendar a reader decodes values (times) with."""
PACKING = ("scale_factor", "add_offset", "_FillValue", "missing_value", "_Unsigned")
"""The attributes that make a comparison read unpacked values."""
MAX_ATTRIBUTE_ELEMENTS = 65_536
"""An attribute of more elements is refused: no CF attribute needs more."""
TEXT = "text"
"""The dtype name of a text attribute (str or bytes alike: its UTF-8 bytes are hashed)."""
UNPACKED_NOTE = "CF-packed: compared unpacked (value * scale_factor + add_offset, fill masked)"


def _text(value: Any) -> str | bytes | None:
    if isinstance(value, str | bytes):
        return value
    arr = np.asarray(value)
    if arr.dtype.kind in "SUO" and arr.size == 1:
        item = arr.reshape(-1)[0]
        return item if isinstance(item, str | bytes) else None
    return None


def attribute_digest(name: str, value: Any) -> DatasetDigest:
    """The digest of one attribute's value: text by its UTF-8 bytes, numbers as an array."""
    text = _text(value)
    if text is not None:
        raw = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
        return DatasetDigest(name, TEXT, (), hashlib.sha256(raw).hexdigest())
    return dataclasses.replace(array_digest(name, np.asarray(value)), path=name)


def _read_attribute(dset: h5py.Dataset, name: str, where: Path | str) -> Any:
    try:
        attr = dset.attrs.get_id(name)
        if (
            attr.shape is not None
            and int(np.prod(attr.shape, dtype=np.int64)) > MAX_ATTRIBUTE_ELEMENTS
        ):
            raise CheckpointError(
                f"attribute {name} of {dset.name} has more than {MAX_ATTRIBUTE_ELEMENTS:,} "
                "elements: refused",
                path=where,
                dataset=dset.name,
            )
        return dset.attrs[name]
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(
            f"cannot read attribute {name} of {dset.name} ({e})", path=where, dataset=dset.name
        ) from None


def reader_attributes(dset: h5py.Dataset, where: Path | str) -> dict[str, Any]:
    """The CF attributes ``dset`` has, by name, read within bounds."""
    try:
        names = [n for n in CF_ATTRIBUTES if n in dset.attrs]
    except (OSError, RuntimeError, KeyError) as e:
        raise CheckpointError(f"cannot list attributes of {dset.name} ({e})", path=where) from None
    return {n: _read_attribute(dset, n, where) for n in names}


def with_attributes(
    opened: OpenFile, datasets: tuple[DatasetDigest, ...]
) -> tuple[DatasetDigest, ...]:
    """``datasets`` (of ``opened``, HDF5) each with the digests of its CF attributes."""
    f = opened.h5()
    out = []
    for d in datasets:
        try:
            dset = f[d.path]
        except (KeyError, OSError, RuntimeError, ValueError) as e:
            raise CheckpointError(f"cannot open dataset {d.path} ({e})", path=opened.path) from None
        attrs = reader_attributes(dset, opened.path)
        digests = tuple(attribute_digest(n, v) for n, v in sorted(attrs.items()))
        out.append(dataclasses.replace(d, attributes=digests))
    return tuple(out)


def unpack(raw: np.ndarray[Any, Any], attrs: Mapping[str, Any]) -> np.ndarray[Any, Any]:
    """The values xarray's CF decoding reads from ``raw`` with these attributes: unsigned
    when ``_Unsigned`` says so, fill and missing values masked as NaN, then scaled and
    offset; float64 whenever any of that applies."""
    data = np.asarray(raw)
    unsigned = _text(attrs["_Unsigned"]) if "_Unsigned" in attrs else None
    if isinstance(unsigned, bytes):
        unsigned = unsigned.decode("utf-8", "replace")
    if unsigned == "true" and data.dtype.kind == "i":
        data = data.view(np.dtype(data.dtype.str.replace("i", "u")))
    masked = np.zeros(data.shape, dtype=bool)
    for key in ("_FillValue", "missing_value"):
        if key in attrs and _text(attrs[key]) is None:
            for fill in np.asarray(attrs[key]).reshape(-1):
                masked |= np.isnan(data) if _isnan(fill) else data == fill
    out = data.astype(np.float64)
    out[masked] = np.nan
    if "scale_factor" in attrs:
        out = out * np.float64(np.asarray(attrs["scale_factor"]).reshape(-1)[0])
    if "add_offset" in attrs:
        out = out + np.float64(np.asarray(attrs["add_offset"]).reshape(-1)[0])
    return out


def _isnan(x: Any) -> bool:
    return bool(np.asarray(x).dtype.kind in "fc" and np.isnan(x))


def packed(attrs: Mapping[str, Any]) -> bool:
    """Whether a reader computes other values than the stored ones (CF packing)."""
    return any(k in attrs for k in PACKING)


class Hdf5Reader:
    """The reader of HDF5 and NetCDF-4 files."""

    format = Format.HDF5

    def sniff(self, name: str, head: bytes, size: int) -> bool:
        return any(head[o : o + 8] == HDF5_SIGNATURE for o in (0, 512, 1024, 2048, 4096, 8192))

    def digests(self, opened: OpenFile) -> tuple[DatasetDigest, ...]:
        datasets, unreadable = diagnose(opened, None)
        if datasets is None:
            raise CheckpointError(unreadable or "not an HDF5 file", path=opened.path)
        return with_attributes(opened, datasets)

    def tensors(self, opened: OpenFile) -> Mapping[str, Tensor]:
        f = opened.h5()
        found: dict[str, Tensor] = {}

        def visit(_: str, obj: object) -> None:
            if isinstance(obj, h5py.Dataset):
                attrs = reader_attributes(obj, opened.path)
                note = UNPACKED_NOTE if packed(attrs) else None
                found[obj.name] = Tensor(obj.name, _loader(obj, attrs, opened), note)

        try:
            f.visititems(visit)
        except (OSError, RuntimeError, KeyError) as e:
            raise CheckpointError(f"corrupt HDF5 structure ({e})", path=opened.path) from None
        return found


def _loader(dset: h5py.Dataset, attrs: Mapping[str, Any], opened: OpenFile) -> Any:
    def load() -> np.ndarray[Any, Any]:
        raw = bounded_read(dset, opened.path)
        return unpack(raw, attrs) if packed(attrs) else raw

    return load


DECODE_RATIO = 1024
"""A dataset is read whole only if it declares at most this many times what the file
stores for it (plus :data:`DECODE_SLACK`), as :mod:`kronos_audit.compare.files` bounds it."""
DECODE_SLACK = 64 * 1024 * 1024


def bounded_read(dset: h5py.Dataset, where: Path | str) -> np.ndarray[Any, Any]:
    """``dset``'s values (text as ``str``), refused with CheckpointError when it declares
    far more than the file stores for it (unwritten chunks decoding for ever)."""
    try:
        if dset.shape is None:
            return np.asarray([], dtype=dset.dtype)
        declared = int(dset.size) * dset.dtype.itemsize
        stored = int(dset.id.get_storage_size())
        if declared > DECODE_RATIO * stored + DECODE_SLACK:
            raise CheckpointError(
                f"dataset {dset.name} declares {declared:,} bytes but the file stores "
                f"{stored:,} for it: not read",
                path=where,
                dataset=dset.name,
            )
        info = h5py.check_string_dtype(dset.dtype)
        source = (
            dset.asstr()
            if info is not None and info.length is None and info.encoding == "utf-8"
            else dset
        )
        return np.asarray(source[()])
    except (OSError, RuntimeError, ValueError, TypeError) as e:
        raise CheckpointError(
            f"cannot read dataset {dset.name} ({e})", path=where, dataset=dset.name
        ) from None


__all__ = [
    "CF_ATTRIBUTES",
    "PACKING",
    "UNPACKED_NOTE",
    "Hdf5Reader",
    "attribute_digest",
    "bounded_read",
    "packed",
    "reader_attributes",
    "unpack",
    "with_attributes",
]
