"""What a checkpoint's file name says about its step.

The runtime names checkpoints ``step-<N:08d>.h5``; snapshot, verify and replay read a
step from any name of the form ``step-<N>`` followed by ``.`` or nothing (leading zeros
ignored), so that a name and a signed step can never contradict each other unnoticed.
"""

from __future__ import annotations

import re

_STEP_NAME = re.compile(r"^step-0*(\d+)(\.|$)")


def named_step(name: str) -> int | None:
    """The step that the file name ``name`` states (``step-100.h5``, ``step-00000100.h5``,
    ``step-7``), or None when it states none."""
    named = _STEP_NAME.match(name)
    return None if named is None else int(named.group(1))
