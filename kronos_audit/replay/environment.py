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

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from kronos_audit._internal.canonical import canonical_json
from kronos_audit.provenance.dispatch import Dispatch, apply_pins, current_dispatch
from kronos_audit.provenance.environment import FRAMEWORKS, NUMERIC_ENV_NAMES, environment_lock
from kronos_audit.replay.interface import Difference, EnvironmentReport, EnvMode, JudgedOn
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


RECORDED_SINCE: frozenset[tuple[str, str]] = frozenset({("torch", "cpu_capability")})
"""(framework, field) pairs that locks record since a later version: absent from a recorded
lock, they are noted, not drift (the lock did not know them)."""


def current_environment(frameworks: Iterable[str] = ()) -> dict[str, Any]:
    """This process's environment lock, read now (the cached one may predate a change
    of the numeric variables made in the same process), describing ``frameworks`` (those
    of them in :data:`~kronos_audit.provenance.environment.FRAMEWORKS`, imported if need be)."""
    return environment_lock(frameworks)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def differences(
    recorded: Mapping[str, Any], current: Mapping[str, Any], *, program: bool = False
) -> list[Difference]:
    """Every field of the two locks that differs, by section then name. ``program``: the
    ``current`` lock is the replayed program's own, so the settings a program makes in its
    own code (:data:`FRAMEWORK_SETTINGS`) were seen, and count as drift."""
    found: list[Difference] = []
    for section in SECTIONS:
        rec: Mapping[str, Any] = recorded.get(section) or {}
        cur: Mapping[str, Any] = current.get(section) or {}
        for name in sorted(set(rec) | set(cur)):
            a, b = _text(rec.get(name)), _text(cur.get(name))
            if a != b:
                # A CPU field one lock lacks was not recorded then (a lock written before
                # kaudit recorded it), or cannot be known before the command has run.
                unknown = section == "cpu" and (a is None or b is None)
                drift = (section, name) not in NOTED_ONLY and not unknown
                found.append(Difference(section, name, a, b, drift))
    if program:  # this process loads only numpy's BLAS, not what the program loads
        found.extend(
            _threadpool_differences(recorded.get("threadpools"), current.get("threadpools"))
        )
    found.extend(
        _framework_differences(
            recorded.get("frameworks") or {}, current.get("frameworks") or {}, program=program
        )
    )
    return found


def _pools(pools: Any) -> dict[str, str | None]:
    """The loaded libraries flat: ``<internal_api>.<field>`` (``openblas.architecture``,
    ``openmp.num_threads``) to text; a second library of one kind numbered
    (``openmp#2.version``)."""
    flat: dict[str, str | None] = {}
    seen: dict[str, int] = {}
    for pool in pools if isinstance(pools, list | tuple) else ():
        if not isinstance(pool, Mapping):
            continue
        kind = str(pool.get("internal_api"))
        seen[kind] = seen.get(kind, 0) + 1
        name = kind if seen[kind] == 1 else f"{kind}#{seen[kind]}"
        for field in ("version", "num_threads", "threading_layer", "architecture"):
            if field in pool:
                flat[f"{name}.{field}"] = _text(pool[field])
    return flat


def _threadpool_differences(recorded: Any, current: Any) -> list[Difference]:
    """The BLAS and OpenMP libraries loaded, field by field: their kernels (OpenBLAS's
    ``architecture``) and thread counts decide bits. Compared only on the replayed
    program's own lock, and when both locks list them (locks written before they were
    recorded do not)."""
    if recorded is None or current is None:
        return []
    a, b = _pools(recorded), _pools(current)
    return [
        Difference("threadpools", key, a.get(key), b.get(key), True)
        for key in sorted(set(a) | set(b))
        if a.get(key) != b.get(key)
    ]


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
    recorded: Mapping[str, Any], current: Mapping[str, Any], *, program: bool
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
                # a field the recorded lock lacks was not recorded then: noted
                since = a is None and (framework, key[0]) in RECORDED_SINCE
                drift = (program or (framework, key[0]) not in FRAMEWORK_SETTINGS) and not since
                found.append(Difference("frameworks", ".".join((framework, *key)), a, b, drift))
    return found


TORCHRUN_DEFAULTS = {"OMP_NUM_THREADS": "1"}
"""What torchrun sets in its workers' environment when it starts more than one on a node
and the variable is not set (``torch.distributed.run`` does, with a warning): a run
recorded under torchrun records it, and its replay's workers get it again."""


def launched(
    here: Mapping[str, Any],
    defaults: Mapping[str, str],
    pins: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """The lock ``here`` as the command's processes see it: each of ``defaults`` (the
    variables their launcher sets where the environment has none) added to its
    ``variables``, each of ``pins`` (what the replay sets: the recorded dispatch of a
    portable run, None removing one) set over them, and its digest taken again."""
    variables = apply_pins({**defaults, **(here.get("variables") or {})}, pins or {})
    out = {k: v for k, v in here.items() if k != "digest"}
    out["variables"] = {k: v for k, v in sorted(variables.items()) if k in NUMERIC_ENV_NAMES}
    if pins:
        # What the pinned command's libraries will choose is known only once it has run
        # (it records its own lock): this process's choices say nothing of them.
        cpu = {k: v for k, v in (here.get("cpu") or {}).items() if k != "numpy_simd"}
        out["cpu"] = {**cpu, "dispatch": current_dispatch(variables).value}
        out.pop("threadpools", None)
    out["digest"] = hashlib.sha256(canonical_json(out)).hexdigest()
    return out


def environment_report(
    recorded: EnvironmentLock | Mapping[str, Any],
    mode: EnvMode = EnvMode.WARN,
    current: EnvironmentLock | Mapping[str, Any] | None = None,
    *,
    launcher_defaults: Mapping[str, str] | None = None,
    pins: Mapping[str, str | None] | None = None,
    program: bool = False,
) -> EnvironmentReport:
    """Compare the recorded lock (a manifest's, or its JSON form) with ``current``
    (default: this machine's, read now), with ``launcher_defaults`` (the variables the
    launcher of the command's ranks sets where they are not set: see :func:`launched`) and
    ``pins`` (the variables the replay sets for them). ``program``: ``current`` is the lock
    the replayed program recorded itself, what it actually ran with (see
    :func:`differences`)."""
    rec = _json(recorded)
    here: Mapping[str, Any]
    if current is None:
        # Only the frameworks the recorded lock names: none named, none imported.
        named = rec.get("frameworks") or {}
        here = current_environment(name for name in FRAMEWORKS if name in named)
    else:
        here = _json(current)
    if (launcher_defaults or pins) and not program:
        here = launched(here, launcher_defaults or {}, pins)
    return EnvironmentReport(
        mode=mode,
        recorded_digest=Sha256(str(rec["digest"])),
        current_digest=Sha256(str(here["digest"])),
        differences=tuple(_portable(rec, here, differences(rec, here, program=program))),
        judged_on=JudgedOn.PROGRAM if program else JudgedOn.REPLAYER,
        kernels=(kernels(rec), kernels(here)),
    )


def kernels(lock: Mapping[str, Any]) -> str:
    """A lock's CPU kernels in words: torch's capability (else the ISA level) on the CPU's
    model, ``(portable)`` when the dispatch was pinned: ``AVX512 on AMD EPYC``."""
    cpu = lock.get("cpu") or {}
    torch = (lock.get("frameworks") or {}).get("torch") or {}
    width = torch.get("cpu_capability") or cpu.get("isa")
    words = " on ".join(str(v) for v in (width, cpu.get("model")) if v)
    return words + (" (portable)" if cpu.get("dispatch") == Dispatch.PORTABLE else "")


PORTABLE_CPU_NOTES = frozenset({"model", "vendor", "count", "isa", "features"})
"""The ``cpu`` fields only noted when both locks ran the portable dispatch: its pins, not
the CPU, chose the kernels (what they chose, numpy's SIMD loops, OpenBLAS's core type,
torch's capability and the thread counts, is compared still)."""


def _portable(
    recorded: Mapping[str, Any], here: Mapping[str, Any], found: list[Difference]
) -> list[Difference]:
    both = all(
        (lock.get("cpu") or {}).get("dispatch") == Dispatch.PORTABLE for lock in (recorded, here)
    )
    if not both:
        return found
    return [
        dataclasses.replace(d, drift=False)
        if d.section == "cpu" and d.name in PORTABLE_CPU_NOTES
        else d
        for d in found
    ]


def _json(lock: EnvironmentLock | Mapping[str, Any]) -> Mapping[str, Any]:
    # The report compares every field of every section, named or not: the JSON form.
    return lock.to_json_obj() if isinstance(lock, EnvironmentLock) else lock
