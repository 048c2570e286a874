"""Format readers: the tensors a reader of each format reads, as canonical digests.

One array has one digest whatever holds it (HDF5, safetensors, npz, npy, a torch DCP
directory), so verify names the tensor that changed and ``kaudit diff`` compares tensor
by tensor across formats. Nothing untrusted is unpickled: pickles get a file digest only,
and a DCP ``.metadata`` is parsed by a restricted unpickler, after its signed digest holds.

``interface`` holds the types (:class:`Format`, :class:`FormatReader`, :class:`Tensor`),
``registry`` the table of readers and the entry points; ``safetensors``, ``npz``, ``cf``
(HDF5 with its CF attributes) and ``dcp`` one reader each.
"""

from typing import TYPE_CHECKING, Any

from kronos_audit.checkpoint.formats.interface import PICKLE_NOTE, Format, FormatReader, Tensor
from kronos_audit.checkpoint.formats.registry import (
    REGISTRY,
    digest_file,
    digest_opened,
    digest_signed,
    open_tensors,
    tensors_of_file,
)

__all__ = [
    "PICKLE_NOTE",
    "REGISTRY",
    "Format",
    "FormatReader",
    "Tensor",
    "digest_file",
    "digest_opened",
    "digest_signed",
    "open_tensors",
    "tensors_of_directory",
    "tensors_of_file",
]

if TYPE_CHECKING:
    from kronos_audit.checkpoint.formats.dcp import tensors_of_directory


def __getattr__(name: str) -> Any:
    # The DCP reader is imported when it is first asked for: a process that checks HDF5
    # files (a verify's workers) never needs it.
    if name == "tensors_of_directory":
        from kronos_audit.checkpoint.formats.dcp import tensors_of_directory

        return tensors_of_directory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
