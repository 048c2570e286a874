"""Where a checkpoint's data is: the one set of words ``kaudit log``, ``kaudit status``,
``kaudit verify`` and the report use, in their text and in their JSON.

Each command says what it can tell from what it looked at: ``kaudit log`` hashes nothing,
so a checkpoint here is ``local`` or ``pushed`` however its bytes read; without asking the
remote, a checkpoint not here and not pruned is ``missing`` (``kaudit log --remote`` and
``kaudit status`` tell it from ``remote-only``).
"""

from __future__ import annotations

import enum


class Location(enum.StrEnum):
    """Where a checkpoint's data is. Its value is the word printed and in JSON."""

    LOCAL = "local"
    """Here and valid, not (fully) in the remote, or the remote was not asked."""
    PUSHED = "pushed"
    """Here and valid, and in the remote."""
    REMOTE_ONLY = "remote-only"
    """Not here; in the remote."""
    PRUNED = "pruned"
    """Not here, deleted on purpose: a signed retention record prunes it (the remote is
    not asked)."""
    MISSING = "missing"
    """Neither here nor in the remote, and not pruned (or not here, not pruned, and the
    remote was not asked, or could not be read)."""
    CORRUPT = "corrupt"
    """Here (or fetched, by ``kaudit verify``), but not the bytes its manifest signs."""


__all__ = ["Location"]
