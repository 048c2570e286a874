"""What kind of data a dataset holds, which decides how it is compared.

Below both the tolerances (:mod:`~kronos_audit.compare.policy`, which rule can apply to a
kind) and the results (:mod:`~kronos_audit.compare.interface`, which carry the tolerance
applied), so that neither of those has to import the other both ways.
"""

from __future__ import annotations

import enum


class DataKind(enum.StrEnum):
    """What kind of data a dataset holds: it decides which tolerance can apply (see
    :meth:`TolerancePolicy.resolve`) and how elements are compared."""

    FLOAT = "float"
    """Real floating point (half, single, double, extended precision)."""
    COMPLEX = "complex"
    """Complex floating point."""
    INTEGER = "integer"
    """Signed or unsigned integers (enums too): exact unless a rule names them."""
    BOOLEAN = "boolean"
    """Booleans: exact unless a rule names them."""
    STRING = "string"
    """Text, fixed or variable length: always exact."""
    BYTES = "bytes"
    """Byte strings, fixed or variable length: always exact."""
    COMPOUND = "compound"
    """Structured records: always exact, byte for byte."""
    OPAQUE = "opaque"
    """Anything else numpy holds as raw bytes: always exact."""
    OBJECT = "object"
    """Python objects (in memory only): always exact."""

    @property
    def numeric(self) -> bool:
        """Measured element by element (errors, ULP), and a tolerance can apply."""
        return self in (DataKind.FLOAT, DataKind.COMPLEX, DataKind.INTEGER, DataKind.BOOLEAN)

    @property
    def counted(self) -> bool:
        """Integers and booleans: compared exactly unless a rule names them."""
        return self in (DataKind.INTEGER, DataKind.BOOLEAN)
