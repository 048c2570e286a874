"""What produced a checkpoint: the environment lock and the git state.

The environment cannot change under a running process in any way that matters here, so it
is captured once per process (:func:`environment`), and again only when the program has
imported a framework since (a lock names the frameworks the program uses). The git state
is read at each snapshot, since a long run may outlive a commit in its checkout.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from kronos_audit._internal import git
from kronos_audit._internal.canonical import canonical_json
from kronos_audit._internal.fsutil import write_atomic
from kronos_audit._internal.secrets import secret_file_reason
from kronos_audit._internal.secrets import strip_credentials as strip_credentials
from kronos_audit.errors import ProjectError, UsageError
from kronos_audit.predicate import GitRecord, Sha256

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

# Paths whose changes are kaudit's own records, not the code being run.
RECORD_PATHSPECS = (":(exclude).kaudit", ":(exclude)*.kaudit.json", ":(exclude)*.dvc")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "Model", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


def _distributions() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[name.lower().replace("_", "-")] = dist.version
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
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }


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
        "cpu": {"model": _cpu_model(), "count": os.cpu_count() or 0},
        "blas": _numpy_blas(),
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


PATCH_LIMIT = 256 * 1024 * 1024
"""Bytes of a recorded patch read at most (from the DVC remote, or to push it there)."""


def patch_name(digest: str) -> str:
    """The file name of the patch whose sha256 is ``digest``, here and in the remote."""
    return f"{digest}.patch"


def patch_path(repo_root: Path, digest: str) -> Path:
    return repo_root / ".kaudit" / "patches" / patch_name(digest)


def patch_note(record: GitRecord) -> str | None:
    """What to tell the user once when ``record`` names an uncommitted patch (None when
    the tree was clean): a replay elsewhere needs that file, so it must travel."""
    if record.patch_sha256 is None:
        return None
    name = f".kaudit/patches/{patch_name(record.patch_sha256)}"
    return (
        f"uncommitted changes recorded as {name}: commit it with the manifests, or "
        "`kaudit push` them to the DVC remote, for a replay elsewhere"
    )


# A PEM private key (RSA, EC, OpenSSH, PKCS#8, encrypted or not) in a changed text file,
# whatever the file is called. A basic regular expression, as git's -G takes it.
PRIVATE_KEY_PATTERN = "-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"


def _refuse_secret_files(repo_root: Path) -> None:
    """Raise UsageError for the first file the recorded patch would carry that looks like
    a secret: by its name (see :func:`kronos_audit._internal.secrets.secret_file_reason`)
    or by holding a PEM private key.

    A file new to the repository (staged, or added with intent) would be published by the
    patch for the first time. A committed one that is modified is refused too: its change
    may be a new secret (a rotated password), and the old one being in the history is no
    reason to record the new one. Deleting such a file publishes nothing and is allowed.
    """
    pathspecs = (".", *RECORD_PATHSPECS)
    try:
        listed = os.fsdecode(
            git.diff_head(repo_root, "--name-status", "--no-renames", "-z", pathspecs=pathspecs)
        ).split("\0")
        keyed = os.fsdecode(
            git.diff_head(
                repo_root,
                "--name-only",
                "--no-renames",
                "--diff-filter=d",
                "-z",
                f"-G{PRIVATE_KEY_PATTERN}",
                pathspecs=pathspecs,
            )
        ).split("\0")
    except git.GitError as e:
        raise ProjectError(f"cannot read git state: {e.message}", path=repo_root) from None
    changes = dict(zip(listed[1::2], listed[0::2], strict=False))
    found = [
        (name, reason)
        for name, status in changes.items()
        if not status.startswith("D") and (reason := secret_file_reason(name))
    ] + [(name, "holds a PEM private key") for name in keyed if name]
    if not found:
        return
    name, reason = found[0]
    if changes.get(name, "A").startswith("A"):
        how = f"unstage it (`git rm --cached -- {name}`)"
    else:
        how = "commit or revert its change first"
    raise UsageError(
        f"looks like a secret ({reason}) and a snapshot would copy it into a patch recorded "
        f"under .kaudit/patches: {how}, or, if it holds no secret, pass --allow-secret-files "
        "(allow_secret_files=True in the Python API)",
        path=repo_root / name,
    )


def git_state(repo_root: Path, *, allow_secret_files: bool = False) -> GitRecord:
    """Read HEAD, branch, remote and the uncommitted diff; store the diff content-addressed.

    Raises UsageError, before anything is written, when the diff would carry a file that
    looks like a secret, unless ``allow_secret_files``.
    """
    try:
        status = git.status(repo_root, ".", *RECORD_PATHSPECS)
    except git.GitError as e:
        raise ProjectError(f"cannot read git state: {e.message}", path=repo_root) from None
    commit: str | None = None
    branch: str | None = None
    dirty = False
    for line in status.splitlines():
        if line.startswith("# branch.oid "):
            commit = line.split()[2]
        elif line.startswith("# branch.head "):
            head = line.split(maxsplit=2)[2]
            branch = None if head == "(detached)" else head
        elif line and not line.startswith("#"):
            dirty = True
    if commit is None or commit == "(initial)":
        raise ProjectError(
            "the repository has no commit yet: commit the code first so manifests can name it",
            path=repo_root,
        )
    patch_sha256 = None
    if dirty and not allow_secret_files:
        _refuse_secret_files(repo_root)
    if dirty:
        # Keep the bytes exactly: a replay must re-apply this patch as it was.
        try:
            patch = git.diff_head(repo_root, "--binary", pathspecs=(".", *RECORD_PATHSPECS))
        except git.GitError as e:
            raise ProjectError(f"cannot read git state: {e.message}", path=repo_root) from None
        patch_sha256 = hashlib.sha256(patch).hexdigest()
        target = patch_path(repo_root, patch_sha256)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, patch)
    try:
        url = git.remote_url(repo_root)
    except git.GitError as e:
        raise ProjectError(f"cannot read git state: {e.message}", path=repo_root) from None
    remote = strip_credentials(url) if url is not None else None
    return GitRecord(
        commit, branch, dirty, None if patch_sha256 is None else Sha256(patch_sha256), remote
    )


def git_tracked(repo_root: Path, paths: list[Path]) -> list[Path]:
    """Those of ``paths`` that git tracks (a checkpoint must not be: DVC tracks it)."""
    try:
        listed = git.ls_files(repo_root, [str(Path(p).absolute()) for p in paths])
    except git.GitError as e:
        raise ProjectError(f"cannot ask git what it tracks: {e.message}", path=repo_root) from None
    tracked = {Path(repo_root, name).resolve() for name in listed}
    return [p for p in paths if Path(p).resolve() in tracked]
