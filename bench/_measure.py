"""What a process costs, from the kernel's own accounting: its CPU seconds and its peak
resident memory. Standard library only, so that importing it changes nothing measured (a
contender's process imports it before its own framework)."""

from __future__ import annotations

import resource


def cpu_seconds() -> float:
    """User and system CPU seconds of this process (all its threads) and of the children
    it waited for."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def status_bytes(field: str) -> int:
    """A size line of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ...), in bytes (Linux)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> int:
    """Reset the process's peak resident size to its current one; return that size."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # Linux: reset VmHWM to VmRSS
    except OSError:
        pass  # the peak then dates from the process's start: an upper bound
    return status_bytes("VmRSS")


def peak() -> int:
    """The peak resident bytes since the last :func:`reset_peak` (or the start)."""
    return status_bytes("VmHWM")


def peak_growth(start: int) -> int:
    """Peak resident bytes since :func:`reset_peak` returned ``start``, less ``start``."""
    return max(0, peak() - start)
