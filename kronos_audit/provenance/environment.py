"""The environment lock: the machine, Python, packages and numerical settings that
produced a checkpoint, with the BLAS and OpenMP libraries loaded and their thread counts.

The environment cannot change under a running process in any way that matters here, so it
is captured once per process (:func:`environment`), and again only when the program has
imported a framework since (a lock names the frameworks the program uses).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import platform
import sys
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.secrets import strip_credentials as strip_credentials
from kronos_audit.provenance.dispatch import cpu_record

# Variables that change what numerical code computes (thread counts change reduction
# orders; hash seeds change iteration orders; TF32/cuBLAS settings change rounding).
# An allow-list of names, not prefixes: the environment is recorded in a signed manifest
# that is kept and published for ever, and `MKL_LICENSE_TOKEN` or `OMP_SECRET` would match
# a prefix as well as `OMP_NUM_THREADS` does. A variable missing here goes unrecorded,
# which costs a replay its drift report for it; a secret recorded cannot be taken back.
NUMERIC_ENV_NAMES = frozenset(
    {
        # OpenMP
        "OMP_NUM_THREADS",
        "OMP_DYNAMIC",
        "OMP_SCHEDULE",
        "OMP_PROC_BIND",
        "OMP_PLACES",
        "OMP_WAIT_POLICY",
        "OMP_MAX_ACTIVE_LEVELS",
        "OMP_NESTED",
        "OMP_THREAD_LIMIT",
        # Intel MKL and its OpenMP runtime
        "MKL_NUM_THREADS",
        "MKL_DYNAMIC",
        "MKL_CBWR",
        "MKL_ENABLE_INSTRUCTIONS",
        "MKL_THREADING_LAYER",
        "MKL_INTERFACE_LAYER",
        "KMP_AFFINITY",
        "KMP_BLOCKTIME",
        "KMP_DETERMINISTIC_REDUCTION",
        # OpenBLAS, BLIS, GotoBLAS, Accelerate
        "OPENBLAS_NUM_THREADS",
        "OPENBLAS_CORETYPE",
        "OPENBLAS_L2_SIZE",
        # the CPU kernels torch and oneDNN choose (kronos_audit.provenance.dispatch)
        "ATEN_CPU_CAPABILITY",
        "ONEDNN_MAX_CPU_ISA",
        "DNNL_MAX_CPU_ISA",
        "ONEDNN_DEFAULT_FPMATH_MODE",
        "DNNL_DEFAULT_FPMATH_MODE",
        "MKL_DEBUG_CPU_TYPE",
        # kaudit's own: the dispatch was pinned portable before the program started
        "KAUDIT_DISPATCH",
        "BLIS_NUM_THREADS",
        "GOTO_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        # numexpr
        "NUMEXPR_NUM_THREADS",
        "NUMEXPR_MAX_THREADS",
        # CUDA, cuBLAS, cuDNN
        "CUDA_VISIBLE_DEVICES",
        "CUDA_LAUNCH_BLOCKING",
        "CUBLAS_WORKSPACE_CONFIG",
        "CUDNN_DETERMINISTIC",
        "NVIDIA_TF32_OVERRIDE",
        # Python, numpy and the frameworks
        "PYTHONHASHSEED",
        "NPY_DISABLE_CPU_FEATURES",
        "TF_DETERMINISTIC_OPS",
        "TF_CUDNN_DETERMINISTIC",
        "XLA_FLAGS",
        "JAX_ENABLE_X64",
        "JAX_PLATFORMS",
        "JAX_DEFAULT_MATMUL_PRECISION",
        "JAX_DEFAULT_PRNG_IMPL",
        "JAX_THREEFRY_PARTITIONABLE",
        "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    }
)


def _numpy_blas() -> dict[str, Any]:
    try:
        import numpy as np

        config = np.show_config(mode="dicts")
    except Exception:
        return {"name": "unknown", "version": "unknown"}
    blas = (config or {}).get("Build Dependencies", {}).get("blas", {})
    return {
        "name": str(blas.get("name", "unknown")),
        "version": str(blas.get("version", "unknown")),
    }


THREADPOOL_FIELDS = ("threading_layer", "architecture")
"""What threadpoolctl says of a library beside its API, version and thread count, when it
says it (OpenBLAS's threading layer and the CPU kernels it chose change results too)."""


def loaded_threadpools() -> list[dict[str, Any]]:
    """The BLAS and OpenMP libraries loaded in this process now, with their thread counts
    (threadpoolctl): ``user_api`` (``blas``, ``openmp``), ``internal_api`` (``openblas``,
    ``mkl``, ``blis``, ``openmp``), ``version``, ``num_threads``, ``library`` (the file's
    name only: its directory may name the user's home) and :data:`THREADPOOL_FIELDS`."""
    # Imported here: only a process that records an environment lock pays.
    from threadpoolctl import threadpool_info

    found = []
    for info in threadpool_info():
        record: dict[str, Any] = {
            "user_api": str(info.get("user_api")),
            "internal_api": str(info.get("internal_api")),
            "version": None if info.get("version") is None else str(info["version"]),
            "num_threads": int(info.get("num_threads") or 0),
            "library": os.path.basename(str(info.get("filepath", ""))),
        }
        for name in THREADPOOL_FIELDS:
            if info.get(name) is not None:
                record[name] = str(info[name])
        found.append(record)
    return sorted(found, key=lambda r: (r["user_api"], r["internal_api"], r["library"]))


def _distributions() -> dict[str, str]:
    # Imported here (some 25 ms): only a process that records an environment lock pays.
    import importlib.metadata

    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        # Parsed once: ``dist.version`` would parse the whole METADATA file again.
        metadata = dist.metadata
        name = metadata["Name"]
        if name:
            found[name.lower().replace("_", "-")] = metadata["Version"]
    return dict(sorted(found.items()))


def numeric_environment_variables() -> dict[str, str]:
    """The variables of :data:`NUMERIC_ENV_NAMES` that are set, and nothing else."""
    return {k: v for k, v in sorted(os.environ.items()) if k in NUMERIC_ENV_NAMES}


FRAMEWORKS = ("torch", "jax")
"""The frameworks a lock can describe, by module name: the only modules kaudit ever
imports on a lock's account (a replay computing its own side; never a name read from a
file)."""


def imported_frameworks() -> tuple[str, ...]:
    """Those of :data:`FRAMEWORKS` this program has imported (``sys.modules``: asking
    imports nothing)."""
    return tuple(name for name in FRAMEWORKS if name in sys.modules)


def _torch_record(torch: Any) -> dict[str, Any]:
    # Versions and defaults of the machine, and the switches a program sets that change
    # what the kernels compute (deterministic algorithms, TF32 matmuls).
    return {
        "version": str(torch.__version__),
        "cuda": torch.version.cuda,
        "cudnn": _cudnn_version(torch),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "float32_matmul_precision": str(torch.get_float32_matmul_precision()),
        "num_threads": int(torch.get_num_threads()),
        # the vector width ATen's kernels were chosen for (ATEN_CPU_CAPABILITY caps it)
        "cpu_capability": _cpu_capability(torch),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }


def _cpu_capability(torch: Any) -> str | None:
    get = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return None if get is None else str(get())


def _cudnn_version(torch: Any) -> int | None:
    try:
        if not torch.backends.cudnn.is_available():
            return None
        version = torch.backends.cudnn.version()
    except RuntimeError:  # a cuDNN torch refuses (a version it was not built for)
        return None
    return None if version is None else int(version)


def _jax_record(jax: Any) -> dict[str, Any]:
    devices: dict[str, int] = {}
    for device in jax.devices():
        devices[str(device.platform)] = devices.get(str(device.platform), 0) + 1
    import importlib.metadata

    try:
        jaxlib = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        jaxlib = None
    return {
        "version": str(jax.__version__),
        "jaxlib": jaxlib,
        "backend": str(jax.default_backend()),
        "x64": bool(jax.config.read("jax_enable_x64")),
        "devices": dict(sorted(devices.items())),
    }


_RECORDS = {"torch": _torch_record, "jax": _jax_record}


def framework_record(name: str, module: ModuleType) -> dict[str, Any]:
    """The lock's record of framework ``name`` (one of :data:`FRAMEWORKS`), read from its
    imported ``module``."""
    return _RECORDS[name](module)


def environment_lock(frameworks: Iterable[str] = ()) -> dict[str, Any]:
    """An environment lock read now, with ``digest`` over all the rest.

    ``frameworks`` names those of :data:`FRAMEWORKS` to describe, each imported here if it
    is not already; one that cannot be imported is left out. The ``frameworks`` section is
    present only when it names one.
    """
    blas = _numpy_blas()  # how numpy was built; imports numpy, so its BLAS is loaded
    env: dict[str, Any] = {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "platform": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "libc": "-".join(platform.libc_ver()),
        },
        "cpu": cpu_record(),  # model, vendor, ISA level, features, dispatch, numpy's SIMD
        "blas": blas,
        "threadpools": loaded_threadpools(),  # what is loaded: numpy's BLAS, OpenMP runtimes
        "variables": numeric_environment_variables(),
        "packages": _distributions(),
    }
    described: dict[str, Any] = {}
    for name in FRAMEWORKS:  # the allow-list, in its order, whatever ``frameworks`` holds
        if name in frameworks:
            module = _import(name)
            if module is not None:
                described[name] = framework_record(name, module)
    if described:
        env["frameworks"] = described
    env["digest"] = hashlib.sha256(canonical_json(env)).hexdigest()
    return env


def _import(name: str) -> ModuleType | None:
    module = sys.modules.get(name)
    if module is not None:
        return module
    try:
        return importlib.import_module(name)
    except Exception:  # not installed, or installed broken: either way, not here
        return None


@functools.cache
def _environment(frameworks: tuple[str, ...]) -> dict[str, Any]:
    return environment_lock(frameworks)


class _Environment:
    """:func:`environment`: a per-process cache keyed by the frameworks imported."""

    def __call__(self) -> dict[str, Any]:
        """The environment lock of this process, with ``digest`` over all the rest; its
        ``frameworks`` section describes the frameworks the program has imported."""
        return _environment(imported_frameworks())

    def cache_clear(self) -> None:
        """Forget the cached locks: the next call reads the environment again."""
        _environment.cache_clear()


environment = _Environment()
"""The environment lock of this process (cached; see :func:`environment_lock`)."""
