"""The CPU's floating-point dispatch: what decides a program's bits besides its code and
its packages.

Numerical libraries choose their kernels for the CPU they find: torch's ATen its vector
width (``ATEN_CPU_CAPABILITY``: default, avx2, avx512), MKL its code branch (``MKL_CBWR``),
oneDNN its instruction set (``ONEDNN_MAX_CPU_ISA``), OpenBLAS its core type
(``OPENBLAS_CORETYPE``), numpy its SIMD loops (``NPY_DISABLE_CPU_FEATURES``), XLA its
vector ISA (``--xla_cpu_max_isa``), and all of them a thread count, which orders their
reductions. Two machines that pick differently compute different bits from the same code
and packages; the same choices give the same bits. So a run can be recorded **portable**:
every one of those choices pinned to a level that every x86-64-v3 CPU has (AVX2 and FMA,
Intel and AMD alike; MKL to its vendor-neutral ``COMPATIBLE`` branch, the only one it
keeps the same on both), and a replay pins the same, whatever CPU it runs on.

Each library reads its variable once, when it first loads or first computes: the pins must
be in the environment before the program starts (``kaudit run --portable``, which sets them
for the command, or ``kaudit replay``, which sets the recorded ones). A program that asks
for the portable dispatch itself (``ka.Run(..., dispatch="portable")``) sets them for what
has not read them yet and for its children, and is told which library had already chosen
(:func:`pin_here`).

The environment lock records what was chosen (:func:`cpu_record`; torch's capability in its
framework record; OpenBLAS's core type among the loaded libraries), so a drift report names
the dispatch that changed.
"""

from __future__ import annotations

import enum
import importlib.metadata
import os
import platform
import re
import sys
import warnings
from collections.abc import Mapping
from typing import Any

DISPATCH_ENV = "KAUDIT_DISPATCH"
"""Set to ``portable`` in a process whose dispatch was pinned before it started: recorded
in the lock's variables, it tells a replay to pin the recorded values again."""


class Dispatch(enum.StrEnum):
    """How a run chooses its CPU kernels."""

    NATIVE = "native"
    """As the libraries choose for the CPU they find: fastest, and bitwise only on the same
    kind of CPU."""
    PORTABLE = "portable"
    """Pinned to what every x86-64-v3 CPU has (:func:`portable_variables`): bitwise on
    another CPU, Intel or AMD, when the replay pins the same."""


DISPATCH_VARIABLES = (
    DISPATCH_ENV,
    "ATEN_CPU_CAPABILITY",
    "MKL_CBWR",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",  # set on some machines beside the core type: given as recorded
    "NPY_DISABLE_CPU_FEATURES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "XLA_FLAGS",
)
"""Every variable the portable dispatch decides (it sets all but ``OPENBLAS_L2_SIZE``,
which some machines set beside the core type): a replay of a portable run gives the command
each one as recorded, and removes those the recording did not have."""

_VALUE = re.compile(r"[A-Za-z0-9_.,= -]{1,512}")
"""What a pinned value may be: names, numbers, commas, spaces and ``--flag=VALUE``."""

XLA_MAX_ISA = "--xla_cpu_max_isa=AVX2"
"""XLA's pin, given only where the installed jaxlib knows the flag (XLA aborts on a flag it
does not know): 0.4.31 and later."""

X86_64_LEVELS: tuple[tuple[str, frozenset[str]], ...] = (
    ("x86-64-v2", frozenset({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"})),
    (
        "x86-64-v3",
        frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}),
    ),
    ("x86-64-v4", frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})),
)
"""The x86-64 micro-architecture levels (psABI), each with the ``/proc/cpuinfo`` flags it
adds to the one before."""

RECORDED_FEATURES = frozenset(
    {
        # x86-64: the vector extensions kernels are chosen by
        "avx",
        "avx2",
        "fma",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "avx_vnni",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
        # aarch64
        "asimd",
        "asimddp",
        "sve",
        "sve2",
        "bf16",
        "i8mm",
        "sme",
    }
)
"""The CPU features a lock records: those numerical kernels are dispatched on."""


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if fields:
                        break  # the first processor is enough: they are all alike
                    continue
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    return fields


def _flags(info: Mapping[str, str]) -> frozenset[str]:
    return frozenset((info.get("flags") or info.get("Features") or "").split())


def isa_level(flags: frozenset[str], machine: str) -> str:
    """The highest x86-64 level (``x86-64-v1`` .. ``x86-64-v4``) whose every flag is in
    ``flags``; on another architecture, its name (``aarch64``)."""
    if machine not in ("x86_64", "AMD64"):
        return machine
    level = "x86-64-v1"
    for name, needed in X86_64_LEVELS:
        if not needed <= flags:
            break
        level = name
    return level


def _umath(numpy: Any) -> Any:
    """numpy's compiled core, which knows its SIMD dispatch (``numpy._core`` since 2.0)."""
    core = getattr(numpy, "_core", None) or getattr(numpy, "core", None)
    return getattr(core, "_multiarray_umath", None)


def numpy_simd() -> str | None:
    """numpy's SIMD dispatch targets enabled in this process, space-separated (``X86_V3
    X86_V4 AVX512_ICL``); None when numpy is not imported (asking imports nothing)."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return None
    umath = _umath(numpy)
    dispatch = getattr(umath, "__cpu_dispatch__", None)
    features = getattr(umath, "__cpu_features__", None)
    if not isinstance(dispatch, list) or not isinstance(features, dict):
        return None
    return " ".join(str(t) for t in dispatch if features.get(t)) or "baseline"


def cpu_record() -> dict[str, Any]:
    """The lock's ``cpu`` section: ``model``, ``count``, and what kernels are chosen by:
    ``vendor``, ``isa`` (the x86-64 level, or the architecture), ``features`` (those of
    :data:`RECORDED_FEATURES` it has), ``dispatch`` (``native`` or ``portable``, as
    :data:`DISPATCH_ENV` says) and, when numpy is imported, ``numpy_simd``."""
    info = _cpuinfo()
    machine = platform.machine()
    flags = _flags(info)
    model = (
        info.get("model name")
        or info.get("Model")
        or info.get("cpu model")
        or platform.processor()
        or machine
    )
    vendor = info.get("vendor_id") or info.get("CPU implementer") or "unknown"
    record: dict[str, Any] = {
        "model": model,
        "count": os.cpu_count() or 0,
        "vendor": vendor,
        "isa": isa_level(flags, machine),
        "features": " ".join(sorted(flags & RECORDED_FEATURES)),
        "dispatch": current_dispatch().value,
    }
    simd = numpy_simd()
    if simd is not None:
        record["numpy_simd"] = simd
    return record


def current_dispatch(environ: Mapping[str, str] | None = None) -> Dispatch:
    """PORTABLE when :data:`DISPATCH_ENV` says so, else NATIVE."""
    env = os.environ if environ is None else environ
    return Dispatch.PORTABLE if env.get(DISPATCH_ENV) == Dispatch.PORTABLE else Dispatch.NATIVE


def default_threads() -> int:
    """The threads a library would start by default here: the CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _numpy_above_v3() -> list[str]:
    """numpy's dispatch targets beyond x86-64-v3 (its AVX-512 loops), as
    ``NPY_DISABLE_CPU_FEATURES`` names them; imports numpy (every program that records a
    lock has it)."""
    import numpy

    targets = [str(t) for t in getattr(_umath(numpy), "__cpu_dispatch__", [])]
    return [t for t in targets if t.startswith(("AVX512", "X86_V4", "AMX"))]


def _jaxlib_knows_max_isa() -> bool:
    try:
        version = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return False
    parts = [int(p) for p in re.findall(r"\d+", version)[:3]]
    return parts >= [0, 4, 31]


class DispatchNotPinned(UserWarning):
    """``Run(..., dispatch="portable")`` was asked for after some library had chosen its
    CPU kernels (numpy's SIMD loops and OpenBLAS's core type when numpy is imported): the
    run's children are pinned, its own bits stay this CPU's."""


class DispatchError(ValueError):
    """The portable dispatch cannot be had here (a CPU below x86-64-v3)."""


def portable_variables(threads: int | None = None) -> dict[str, str]:
    """The variables that pin this machine's libraries to the portable dispatch, with
    ``threads`` threads each (default: :func:`default_threads`; a replay gives the recorded
    count). Raises DispatchError on an x86-64 CPU below x86-64-v3."""
    n = str(threads if threads is not None else default_threads())
    pins = {
        DISPATCH_ENV: Dispatch.PORTABLE.value,
        "OMP_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        "OPENBLAS_NUM_THREADS": n,
    }
    machine = platform.machine()
    if machine in ("x86_64", "AMD64"):
        level = isa_level(_flags(_cpuinfo()), machine)
        if level < "x86-64-v3":
            raise DispatchError(
                f"the portable dispatch needs an x86-64-v3 CPU (AVX2, FMA); this one is {level}"
            )
        pins |= {
            "ATEN_CPU_CAPABILITY": "avx2",
            # MKL's only branch that is the same on Intel and AMD: its AVX2 branch exists on
            # Intel CPUs alone (elsewhere MKL takes AUTO, the CPU's own). Its SSE2 code
            # costs matrix products about 1.5-2x here; the rest keeps AVX2.
            "MKL_CBWR": "COMPATIBLE",
            "ONEDNN_MAX_CPU_ISA": "AVX2",
            "DNNL_MAX_CPU_ISA": "AVX2",
            "OPENBLAS_CORETYPE": "Haswell",
        }
        above = _numpy_above_v3()
        if above:
            pins["NPY_DISABLE_CPU_FEATURES"] = " ".join(above)
        if _jaxlib_knows_max_isa():
            flags = os.environ.get("XLA_FLAGS", "").split()
            flags = [f for f in flags if not f.startswith("--xla_cpu_max_isa=")]
            pins["XLA_FLAGS"] = " ".join([*flags, XLA_MAX_ISA])
    elif machine in ("aarch64", "arm64"):
        # NEON is every aarch64's; SVE's width is not.
        pins |= {"ATEN_CPU_CAPABILITY": "default", "OPENBLAS_CORETYPE": "ARMV8"}
    return pins


def replay_pins(recorded: Mapping[str, str]) -> dict[str, str | None]:
    """What a replay gives its command of a run recorded with the variables ``recorded``:
    for a portable run, every one of :data:`DISPATCH_VARIABLES` as recorded (None: removed,
    the recording had none); for a native run, nothing (the command sees this machine's
    environment, and a drift report says what differs). Raises ValueError for a recorded
    value that is not a plain setting (names, numbers, ``--flag=VALUE``)."""
    if current_dispatch(recorded) is not Dispatch.PORTABLE:
        return {}
    pins: dict[str, str | None] = {}
    for name in DISPATCH_VARIABLES:
        value = recorded.get(name)
        if value is not None and not _VALUE.fullmatch(value):
            raise ValueError(f"the recorded {name} is not a plain setting: {value[:60]!r}")
        pins[name] = value
    return pins


def apply_pins(base: Mapping[str, str], pins: Mapping[str, str | None]) -> dict[str, str]:
    """``base`` with each of ``pins`` set (None: removed)."""
    env = dict(base)
    for name, value in pins.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def pin_here(dispatch: Dispatch) -> list[str]:
    """Pin this process to ``dispatch`` where it still can, and its children wholly: for
    PORTABLE, :func:`portable_variables` into ``os.environ`` (unless the process started
    with them already), then each library that had already chosen otherwise, in words
    (numpy's SIMD loops and OpenBLAS's core type are chosen when numpy is imported, torch's
    capability at its first kernel). NATIVE changes nothing. Raises DispatchError where the
    portable dispatch cannot be had."""
    if dispatch is Dispatch.NATIVE or current_dispatch() is Dispatch.PORTABLE:
        return []
    pins = portable_variables()
    os.environ.update(pins)
    chosen: list[str] = []
    disabled = set(pins.get("NPY_DISABLE_CPU_FEATURES", "").split())
    simd = numpy_simd()
    if simd is not None and disabled & set(simd.split()):
        chosen.append(f"numpy's SIMD loops ({simd})")
    wanted_core = pins.get("OPENBLAS_CORETYPE")
    if wanted_core is not None and "numpy" in sys.modules:
        from threadpoolctl import threadpool_info

        for pool in threadpool_info():
            arch = str(pool.get("architecture") or "")
            if pool.get("internal_api") == "openblas" and arch.lower() not in (
                "",
                wanted_core.lower(),
            ):
                chosen.append(f"OpenBLAS's {arch} kernels")
    torch = sys.modules.get("torch")
    wanted_cap = pins.get("ATEN_CPU_CAPABILITY")
    if torch is not None and wanted_cap is not None:
        capability = str(torch.backends.cpu.get_cpu_capability())
        if capability.lower() != wanted_cap:
            chosen.append(f"torch's {capability} kernels")
    return chosen


def pin_dispatch(asked: str) -> Dispatch:
    """What ``Run(..., dispatch=asked)`` does: :func:`pin_here`, a
    :class:`DispatchNotPinned` warning naming each library that had already chosen, and a
    one-line UsageError for a dispatch it does not know or cannot have here."""
    from kronos_audit.errors import UsageError

    try:
        dispatch = Dispatch(asked)
    except ValueError:
        raise UsageError(f"dispatch must be 'native' or 'portable', got {asked!r}") from None
    try:
        chosen = pin_here(dispatch)
    except DispatchError as e:
        raise UsageError(str(e)) from None
    if chosen:
        warnings.warn(
            DispatchNotPinned(
                "the portable dispatch was asked for after "
                + ", ".join(chosen)
                + " had been chosen for this CPU: this run's bits stay this CPU's; start it "
                "under `kaudit run --portable` (or with the variables it sets in the "
                "environment before Python starts) to record a run that replays bitwise on "
                "another CPU"
            ),
            stacklevel=3,
        )
    return dispatch
