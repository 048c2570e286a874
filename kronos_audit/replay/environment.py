"""Environment drift: this machine's environment lock against the recorded one.

Both locks have the shape :func:`kronos_audit.provenance.environment` gives. Every
difference is reported; those that can change what the code computes count as *drift*
(``--env strict`` refuses to run on them), the others are only noted:

============  ==========================================  ===================================
section       drift                                       noted only
============  ==========================================  ===================================
python        ``version``, ``implementation``             ``executable`` (where the
                                                          interpreter lives)
platform      ``system``, ``machine``, ``libc``, any      ``release`` (the kernel's version)
              other field
cpu           ``model`` (SIMD paths), ``count`` (default
              thread counts, hence reduction orders)
blas          every field
variables     every numeric variable added, removed or
              changed (``OMP_*``, ``MKL_*``,
              ``PYTHONHASHSEED``, ...)
packages      every package added, removed or changed     ``kronos-audit`` itself: the tool
                                                          doing the replay, whose hashes
                                                          are over canonical data
============  ==========================================  ===================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kronos_audit.predicate import ENVIRONMENT_SECTIONS, EnvironmentLock, Sha256
from kronos_audit.provenance import environment
from kronos_audit.replay.interface import Difference, EnvironmentReport, EnvMode

SECTIONS = ENVIRONMENT_SECTIONS
NOTED_ONLY: frozenset[tuple[str, str]] = frozenset(
    {
        ("python", "executable"),
        ("platform", "release"),
        ("packages", "kronos-audit"),
    }
)
"""(section, name) pairs that are reported but never count as drift."""


def current_environment() -> dict[str, Any]:
    """This process's environment lock, read now (the cached one may predate a change
    of the numeric variables made in the same process)."""
    return environment.__wrapped__()


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[Difference]:
    """Every field of the two locks that differs, by section then name."""
    found: list[Difference] = []
    for section in SECTIONS:
        rec: Mapping[str, Any] = recorded.get(section) or {}
        cur: Mapping[str, Any] = current.get(section) or {}
        for name in sorted(set(rec) | set(cur)):
            a, b = _text(rec.get(name)), _text(cur.get(name))
            if a != b:
                drift = (section, name) not in NOTED_ONLY
                found.append(Difference(section, name, a, b, drift))
    return found


def environment_report(
    recorded: EnvironmentLock | Mapping[str, Any],
    mode: EnvMode = EnvMode.WARN,
    current: EnvironmentLock | Mapping[str, Any] | None = None,
) -> EnvironmentReport:
    """Compare the recorded lock (a manifest's, or its JSON form) with ``current``
    (default: this machine's, read now)."""
    rec = _json(recorded)
    here = _json(current if current is not None else current_environment())
    return EnvironmentReport(
        mode=mode,
        recorded_digest=Sha256(str(rec["digest"])),
        current_digest=Sha256(str(here["digest"])),
        differences=tuple(differences(rec, here)),
    )


def _json(lock: EnvironmentLock | Mapping[str, Any]) -> Mapping[str, Any]:
    # The report compares every field of every section, named or not: the JSON form.
    return lock.to_json_obj() if isinstance(lock, EnvironmentLock) else lock
