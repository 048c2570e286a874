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
frameworks    a recorded framework missing here; its      the switches a program sets in
              ``version`` and the machine's CUDA, cuDNN,  its own code (torch's
              backend, devices (``torch.cuda``,           ``deterministic_algorithms``,
              ``jax.backend``, ...)                       ``num_threads``, ...; jax's
                                                          ``x64``), and a framework the
                                                          recorded program did not import
============  ==========================================  ===================================

The ``frameworks`` section (torch, jax) is compared field by field, each named
``<framework>.<field>`` (``torch.cudnn``; a nested field ``jax.devices.cpu``). This side's
record is read in this process, which imports for it each framework the recorded lock
names (only those of :data:`kronos_audit.provenance.environment.FRAMEWORKS`; nothing named
by the file
is imported), and nothing when it names none. The settings a program makes itself cannot
be seen from here (a fresh import has the defaults): the replayed program, the same code,
makes them again, so their differences are noted, not drift. Those that come from the
environment (``CUBLAS_WORKSPACE_CONFIG``, ``JAX_ENABLE_X64``) are also variables, and
drift there.

The command's ranks may not see this process's variables exactly: their launcher can add
some (torchrun gives more than one worker ``OMP_NUM_THREADS=1`` when it is unset, see
:data:`TORCHRUN_DEFAULTS`). Those are compared as the ranks will see them
(``launcher_defaults`` of :func:`environment_report`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from kronos_audit._internal.canonical import canonical_json
from kronos_audit.provenance.environment import FRAMEWORKS, environment_lock
from kronos_audit.replay.interface import Difference, EnvironmentReport, EnvMode
from kronos_audit.statement.predicate import ENVIRONMENT_SECTIONS, EnvironmentLock, Sha256

SECTIONS = ENVIRONMENT_SECTIONS
NOTED_ONLY: frozenset[tuple[str, str]] = frozenset(
    {
        ("python", "executable"),
        ("platform", "release"),
        ("packages", "kronos-audit"),
    }
)
"""(section, name) pairs that are reported but never count as drift."""

FRAMEWORK_SETTINGS: frozenset[tuple[str, str]] = frozenset(
    {
        ("torch", "deterministic_algorithms"),
        ("torch", "cudnn_deterministic"),
        ("torch", "cudnn_benchmark"),
        ("torch", "float32_matmul_precision"),
        ("torch", "num_threads"),
        ("jax", "x64"),
    }
)
"""(framework, field) pairs a program sets in its own code: reported, never drift (this
process, which compares, sees only their defaults)."""


def current_environment(frameworks: Iterable[str] = ()) -> dict[str, Any]:
    """This process's environment lock, read now (the cached one may predate a change
    of the numeric variables made in the same process), describing ``frameworks`` (those
    of them in :data:`~kronos_audit.provenance.environment.FRAMEWORKS`, imported if need be)."""
    return environment_lock(frameworks)


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
    found.extend(
        _framework_differences(recorded.get("frameworks") or {}, current.get("frameworks") or {})
    )
    return found


def _fields(record: Mapping[str, Any]) -> dict[tuple[str, ...], str | None]:
    """A framework's record flat, ``(field,)`` or ``(field, inner)`` (one level of
    nesting, as the manifest schema allows) to text."""
    flat: dict[tuple[str, ...], str | None] = {}
    for name, value in record.items():
        if isinstance(value, Mapping):
            for inner, v in value.items():
                flat[(str(name), str(inner))] = _text(v)
        else:
            flat[(str(name),)] = _text(value)
    return flat


def _framework_differences(
    recorded: Mapping[str, Any], current: Mapping[str, Any]
) -> list[Difference]:
    found: list[Difference] = []
    for framework in sorted(set(recorded) | set(current)):
        rec, cur = recorded.get(framework), current.get(framework)
        if not isinstance(rec, Mapping) or not isinstance(cur, Mapping):
            # On one side only: missing here is drift (the program needs it, or ran
            # without it); one the recorded program did not import does not matter.
            present = rec if isinstance(rec, Mapping) else cur
            version = _text((present or {}).get("version")) or "present"
            if isinstance(rec, Mapping):
                found.append(Difference("frameworks", framework, version, None, True))
            else:
                found.append(Difference("frameworks", framework, None, version, False))
            continue
        a_fields, b_fields = _fields(rec), _fields(cur)
        for key in sorted(set(a_fields) | set(b_fields)):
            a, b = a_fields.get(key), b_fields.get(key)
            if a != b:
                drift = (framework, key[0]) not in FRAMEWORK_SETTINGS
                found.append(Difference("frameworks", ".".join((framework, *key)), a, b, drift))
    return found


TORCHRUN_DEFAULTS = {"OMP_NUM_THREADS": "1"}
"""What torchrun sets in its workers' environment when it starts more than one on a node
and the variable is not set (``torch.distributed.run`` does, with a warning): a run
recorded under torchrun records it, and its replay's workers get it again."""


def launched(here: Mapping[str, Any], defaults: Mapping[str, str]) -> dict[str, Any]:
    """The lock ``here`` as the command's processes see it: each of ``defaults`` (the
    variables their launcher sets where the environment has none) added to its
    ``variables``, and its digest taken again."""
    variables = {**defaults, **(here.get("variables") or {})}
    out = {k: v for k, v in here.items() if k != "digest"}
    out["variables"] = dict(sorted(variables.items()))
    out["digest"] = hashlib.sha256(canonical_json(out)).hexdigest()
    return out


def environment_report(
    recorded: EnvironmentLock | Mapping[str, Any],
    mode: EnvMode = EnvMode.WARN,
    current: EnvironmentLock | Mapping[str, Any] | None = None,
    *,
    launcher_defaults: Mapping[str, str] | None = None,
) -> EnvironmentReport:
    """Compare the recorded lock (a manifest's, or its JSON form) with ``current``
    (default: this machine's, read now), with ``launcher_defaults`` (the variables the
    launcher of the command's ranks sets where they are not set: see :func:`launched`)."""
    rec = _json(recorded)
    here: Mapping[str, Any]
    if current is None:
        # Only the frameworks the recorded lock names: none named, none imported.
        named = rec.get("frameworks") or {}
        here = current_environment(name for name in FRAMEWORKS if name in named)
    else:
        here = _json(current)
    if launcher_defaults:
        here = launched(here, launcher_defaults)
    return EnvironmentReport(
        mode=mode,
        recorded_digest=Sha256(str(rec["digest"])),
        current_digest=Sha256(str(here["digest"])),
        differences=tuple(differences(rec, here)),
    )


def _json(lock: EnvironmentLock | Mapping[str, Any]) -> Mapping[str, Any]:
    # The report compares every field of every section, named or not: the JSON form.
    return lock.to_json_obj() if isinstance(lock, EnvironmentLock) else lock
