"""A package's names, each imported from its module the first time it is used (PEP 562).

A package that gives names from its modules without importing them at its own import
(``import kronos_audit as ka`` must not load HDF5, DVC or the run loop) hands a table of
``{module: (name, ...)}`` to :func:`lazy_exports` and takes back its ``__all__``,
``__getattr__`` and ``__dir__``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any


def lazy_exports(
    package: str, table: Mapping[str, tuple[str, ...]], namespace: MutableMapping[str, Any]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for ``package`` (its ``__name__``),
    whose ``namespace`` (its ``globals()``) gets each name of ``table`` the first time it
    is asked for: the next lookup is an ordinary attribute. Any other name raises
    AttributeError (a submodule not imported yet: the import system then imports it)."""
    module_of = {name: module for module, names in table.items() for name in names}
    names = sorted(module_of)

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return names, __getattr__, __dir__


def joined(*tables: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """One table of the names of ``tables``: each module's names from every table, in
    order, each once (a package that gives a sub-package's names reads its table)."""
    out: dict[str, tuple[str, ...]] = {}
    for table in tables:
        for module, names in table.items():
            have = out.get(module, ())
            out[module] = have + tuple(n for n in names if n not in have)
    return out


__all__ = ["joined", "lazy_exports"]
