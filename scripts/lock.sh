#!/usr/bin/env bash
# Refresh constraints.txt, the lock of every version scripts/bootstrap.sh installs, after an
# edit of pyproject.toml's dependencies or of scripts/lock.in:
#
#     bash scripts/lock.sh                  # pins that still fit are kept
#     bash scripts/lock.sh --upgrade        # every pin to the newest release that fits
#
# uv resolves pyproject.toml's dependencies with the extras bootstrap installs, and
# scripts/lock.in (uv itself, torch's CPU release), for every platform at once (--universal,
# from Python 3.11, pyproject's requires-python), from the indexes pip is configured with
# (scripts/uv_install.py). Needs the .venv bootstrap.sh makes (its uv); extra arguments go to
# `uv pip compile`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
if [ ! -x "$ROOT/.venv/bin/uv" ]; then
    echo "scripts/lock.sh needs .venv/bin/uv: run 'source scripts/bootstrap.sh' once first" >&2
    exit 2
fi
LOCK=constraints.txt
OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
# uv keeps the pins of the output file it is given where they still fit: the current lock's
if [ -f "$LOCK" ]; then
    cp "$LOCK" "$OUT"
fi
status=0
"$PY" scripts/uv_install.py compile --quiet --universal --python-version 3.11 \
    pyproject.toml scripts/lock.in \
    --extra dev --extra test --extra torch --extra jax --extra mpi --extra docs --extra dask --extra ray \
    --extra dcp --extra hf --extra lightning --extra orbax \
    --custom-compile-command "bash scripts/lock.sh" --output-file "$OUT" "$@" || status=$?
if [ "$status" -ne 0 ]; then
    echo "scripts/lock.sh: uv could not compile the lock (exit $status); $LOCK is unchanged" >&2
    exit "$status"
fi
{
    echo "# The lock: the version of every package scripts/bootstrap.sh installs, given to uv and"
    echo "# to pip as constraints, so the README's commands install the same versions everywhere."
    echo "# pyproject.toml keeps ranges (kronos-audit installs into its users' environments); this"
    echo "# file pins them. Refresh it after editing pyproject.toml's dependencies or"
    echo "# scripts/lock.in, and commit both: bash scripts/lock.sh (--upgrade for newer releases)."
    echo "# tests/test_lock.py fails while they disagree."
    "$PY" scripts/lock_digest.py pyproject.toml  # the digest line tests/test_lock.py checks
    cat "$OUT"  # uv's output alone: it writes the file anew
} >"$LOCK.tmp"
mv "$LOCK.tmp" "$LOCK"
echo "wrote $LOCK"
