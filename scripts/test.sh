#!/usr/bin/env bash
# Install everything into .venv, then run the whole suite: ruff (the code and the docs' Python
# blocks), mypy (strict, over everything), the docs site's strict build, pytest.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k verify`. pytest runs with one
# worker more than there are cores (pytest-xdist: a third of the suite's time is spent
# waiting on the processes its tests start; KAUDIT_TEST_WORKERS=N for N workers, 0 for none)
# and prints the 15 slowest tests.
# The machine's programs the tests run (h5diff, chromium, sshd, Slurm) install from Debian's
# packages in the background while the environment is set up: one apt run, off the path of
# the tests, which would otherwise each wait for an install of their own. Its verdict is
# printed before pytest starts; a test whose program is still missing says so itself.
TOOLS_LOG="$(mktemp)"
bash "$(dirname "$0")/ensure-tools.sh" >"$TOOLS_LOG" 2>&1 &
TOOLS_PID=$!
trap 'rm -f "$TOOLS_LOG"' EXIT
# Bytecode: each module is compiled the first time a process imports it, and kept for the
# next, in the environment's own cache (PYTHONPYCACHEPREFIX: outside the source trees, so
# that no test's repository gains a __pycache__ directory), instead of every installed
# module at install (most of them are never imported). A cached module is used only while
# its source keeps the size and modification time (to the second) it was compiled from: the
# programs the tests write, and rewrite within a second, are run as scripts, never cached.
unset PYTHONDONTWRITEBYTECODE
PYTHONPYCACHEPREFIX="$(cd "$(dirname "$0")/.." && pwd)/.venv/pycache"
export PYTHONPYCACHEPREFIX
# (what earlier runs' tests compiled in their temporary directories is of no further use)
rm -rf "$PYTHONPYCACHEPREFIX${TMPDIR:-/tmp}/pytest-of-"*
COMPILE_AT_INSTALL=0
source "$(dirname "$0")/bootstrap.sh"
cd "$ROOT"
PY_DIRS=(kronos_audit tests bench examples scripts)
# mypy needs one core for half a minute: it runs beside the other checks and the tests, and
# its verdict is printed and counted at the end.
MYPY_LOG="$(mktemp)"
mypy >"$MYPY_LOG" 2>&1 &
MYPY_PID=$!
# The docs site, built strictly (mkdocs.yml), the same way: a broken link or anchor between
# the pages, or a docstring's cross-reference to nothing, fails. A few CPU-seconds.
DOCS_LOG="$(mktemp)"
DOCS_SITE="$(mktemp -d)"
mkdocs build --strict --site-dir "$DOCS_SITE" >"$DOCS_LOG" 2>&1 &
DOCS_PID=$!
# The docs' Python blocks (compiled, their imports run in an interpreter of their own,
# formatted) the same way: some ten CPU-seconds that no test waits for.
DOC_CODE_LOG="$(mktemp)"
python scripts/check_doc_code.py >"$DOC_CODE_LOG" 2>&1 &
DOC_CODE_PID=$!
# a check that fails first stops mypy and the docs' checks too, and leaves no log behind
trap 'kill "$MYPY_PID" "$DOCS_PID" "$DOC_CODE_PID" 2>/dev/null || true
rm -rf "$MYPY_LOG" "$DOCS_LOG" "$DOCS_SITE" "$DOC_CODE_LOG" "$TOOLS_LOG"' EXIT
echo "== ruff"
ruff format --check "${PY_DIRS[@]}"
ruff check "${PY_DIRS[@]}"
wait "$TOOLS_PID" || echo "== the tests' programs are not all installed: $(tail -n 1 "$TOOLS_LOG")"
echo "== pytest"
# The project's own modules byte-compiled once, here, on both cores: the pytest workers and
# the processes the tests start (MPI ranks, kaudit, the examples) then all find them.
python -m compileall -q -j 0 "${PY_DIRS[@]}" >/dev/null
set +e
python -m pytest -n "${KAUDIT_TEST_WORKERS:-$(($(nproc) + 1))}" --durations=15 "$@"
status=$?
wait "$MYPY_PID"
mypy_status=$?
wait "$DOCS_PID"
docs_status=$?
wait "$DOC_CODE_PID"
doc_code_status=$?
set -e
echo "== python blocks of README.md and docs/*.md (compile, imports, ruff format)"
cat "$DOC_CODE_LOG"
echo "== mypy --strict (pyproject's files: the package, tests, bench, examples, scripts)"
cat "$MYPY_LOG"
echo "== mkdocs build --strict (the docs site, its API reference from the docstrings)"
if [ "$docs_status" -eq 0 ]; then
    echo "docs site built, no warning"
else
    cat "$DOCS_LOG"
fi
if [ "$mypy_status" -ne 0 ]; then
    exit "$mypy_status"
fi
if [ "$docs_status" -ne 0 ]; then
    exit "$docs_status"
fi
if [ "$doc_code_status" -ne 0 ]; then
    exit "$doc_code_status"
fi
if [ "$status" -eq 5 ]; then
    echo "pytest collected no test: nothing to fail" >&2
    exit 0
fi
exit "$status"
