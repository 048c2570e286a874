# Sourced by demo.sh and test.sh: make .venv with kronos-audit (editable), linters, test tools.
# Needs only Python 3.11+ and git; everything else comes from the package index.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "kronos-audit needs Python 3.11 or newer as '$PYTHON' (set PYTHON=... to pick one)" >&2
    exit 2
fi
command -v git >/dev/null || { echo "kronos-audit needs git on PATH" >&2; exit 2; }
if [ ! -x "$ROOT/.venv/bin/python" ]; then
    "$PYTHON" -m venv "$ROOT/.venv"
fi
VENV="$ROOT/.venv"
# The lock (scripts/lock.sh writes it): every version installed below is the one it pins, with
# uv and with pip alike, so every machine gets the same environment.
LOCK="$ROOT/constraints.txt"
# the CPU build of PyTorch installed for the examples and tests: the release the lock pins
TORCH_CPU="$(sed -n 's/^torch==\([^ ;]*\).*/\1/p' "$LOCK" 2>/dev/null || true)"
if [ -z "$TORCH_CPU" ]; then
    echo "$LOCK: no torch==VERSION line; restore it from git, or run: bash scripts/lock.sh" >&2
    exit 2
fi
# Installed packages are byte-compiled as they are installed: where PYTHONDONTWRITEBYTECODE
# is set (as on CI machines) every process would otherwise compile what it imports anew.
# With COMPILE_AT_INSTALL=0 they are not (scripts/test.sh, whose processes write the
# bytecode of what they import to a cache of their own: most of the 18,000 modules
# installed are never imported, and compiling them all costs a minute of CPU).
if [ "${COMPILE_AT_INSTALL:-1}" = 0 ]; then
    PIP_NO_COMPILE=(--no-compile)
    UV_NO_COMPILE=(--no-compile-bytecode)
else
    PIP_NO_COMPILE=()
    UV_NO_COMPILE=()
fi
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PIP_NO_COMPILE[@]}")
pip_install() {  # pip, without its notes about configured index locations that do not exist
    "${PIP[@]}" "$@" 2> >(grep -v "^WARNING: Location 'file://.*' is ignored" >&2)
}
# uv where it can be had: the same versions from the same indexes as pip
# (scripts/uv_install.py), in a third of the time (unpacked and byte-compiled in
# parallel); else, or if uv fails, pip.
uv_install() { "$VENV/bin/python" "$ROOT/scripts/uv_install.py" "$@" "${UV_NO_COMPILE[@]}"; }
HAVE_UV=0
"${PIP[@]}" -c "$LOCK" uv 2>/dev/null && HAVE_UV=1
# PyTorch's CPU build first: the package index's default torch is a CUDA build of several
# GB. Take the CPU wheel pip's configured find-links hold (--no-index: nothing else), else
# PyTorch's own CPU index; its dependencies come from the package index below. Another
# release than the lock's is replaced here, as the CPU build, not by the index's below.
if ! "$VENV/bin/python" -c "import sys, torch
sys.exit(torch.__version__.split('+')[0] != '$TORCH_CPU')" 2>/dev/null; then
    { [ "$HAVE_UV" -eq 1 ] && uv_install --no-index --no-deps "torch==$TORCH_CPU" 2>/dev/null; } \
        || "${PIP[@]}" --no-index --no-deps "torch==$TORCH_CPU" 2>/dev/null \
        || pip_install --no-deps "torch==$TORCH_CPU" --index-url https://download.pytorch.org/whl/cpu
fi
if ! { [ "$HAVE_UV" -eq 1 ] && uv_install -c "$LOCK" -e "$ROOT[dev,test,torch,jax,mpi,docs,dask,ray,dcp,hf,lightning,orbax]"; }; then
    pip_install -c "$LOCK" -e "$ROOT[dev,test,torch,jax,mpi,docs,dask,ray,dcp,hf,lightning,orbax]"
fi
export PATH="$VENV/bin:$PATH"
export DVC_NO_ANALYTICS=1
