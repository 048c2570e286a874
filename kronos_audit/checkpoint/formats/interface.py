"""What a format reader is: the :class:`Format` names a manifest records, the
:class:`FormatReader` protocol every reader implements, and the :class:`Tensor` a reader
hands a comparison.

A reader gives, for one file it recognises, the tensors a reader of that format would
read, each as a :class:`~kronos_audit.checkpoint.hashing.DatasetDigest` over the canonical
bytes (C order, little-endian, as for an HDF5 dataset): so one array stored as
safetensors, npz or HDF5 has one digest. Names are the format's own, behind a ``/``
(``/model.weight``, ``/u``), as a manifest's dataset paths are.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from kronos_audit.checkpoint.hashing import DatasetDigest, OpenFile


class Format(enum.StrEnum):
    """A checkpoint's format, as kaudit chose its reader (a manifest's ``format``)."""

    HDF5 = "hdf5"
    """HDF5 and NetCDF-4: datasets, with the CF attributes that change their values."""
    SAFETENSORS = "safetensors"
    """A safetensors file: tensors from its header's offsets."""
    NPZ = "npz"
    """numpy's zip of ``.npy`` members (stored or deflated)."""
    NPY = "npy"
    """One numpy array file."""
    DCP = "dcp"
    """A torch distributed checkpoint directory (``.metadata`` and ``*.distcp``)."""
    PICKLE = "pickle"
    """A pickle (``torch.save``, Lightning): its file digest only; never unpickled."""
    BYTES = "bytes"
    """Any other file: its file digest only."""

    @property
    def has_tensors(self) -> bool:
        """Whether its reader gives per-tensor digests (else only the file digest)."""
        return self not in (Format.PICKLE, Format.BYTES)


PICKLE_NOTE = "a pickle: its file digest only; ok does not mean safe to load"
"""What every command says of a checkpoint recorded as a pickle: verifying its bytes says
nothing of what unpickling them would run."""


@dataclass(frozen=True)
class Tensor:
    """One tensor of a file, as a comparison reads it."""

    path: str
    """Its name behind a ``/``, as its digest's ``path``."""
    load: Callable[[], np.ndarray[Any, Any]]
    """Its values as numpy reads them (a view of the mapped file where it can be)."""
    note: str | None = None
    """How the values were derived from the stored ones, when they were (CF unpacking)."""


class FormatReader(Protocol):
    """Reads one format: recognises it, digests its tensors, loads them for a comparison.
    Every method reads only ``opened`` (one descriptor, or its private copy), bounds
    what it reads, and raises :class:`~kronos_audit.errors.CheckpointError` naming the
    file (and the tensor) for what it cannot read or cover."""

    @property
    def format(self) -> Format:
        """The format it reads."""
        ...

    def sniff(self, name: str, head: bytes, size: int) -> bool:
        """Whether a file called ``name`` of ``size`` bytes that starts with ``head`` (its
        first :data:`~kronos_audit.checkpoint.formats.registry.HEAD` bytes) is of its format."""
        ...

    def digests(self, opened: OpenFile) -> tuple[DatasetDigest, ...]:
        """Every tensor's digest, sorted by path."""
        ...

    def tensors(self, opened: OpenFile) -> Mapping[str, Tensor]:
        """Every tensor, by path, to load one at a time (the file stays open meanwhile)."""
        ...


__all__ = ["PICKLE_NOTE", "Format", "FormatReader", "Tensor"]
