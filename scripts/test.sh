#!/usr/bin/env bash
# Install everything into .venv, then run the whole suite: ruff (the code and the docs' Python
# blocks), mypy (strict, over everything), pytest.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k verify`. pytest runs on every
# core (pytest-xdist; KAUDIT_TEST_WORKERS=N for N workers, 0 for none) and prints the 15
# slowest tests.
source "$(dirname "$0")/bootstrap.sh"
cd "$ROOT"
PY_DIRS=(kronos_audit tests bench examples scripts)
echo "== ruff"
ruff format --check "${PY_DIRS[@]}"
ruff check "${PY_DIRS[@]}"
echo "== python blocks of README.md and docs/*.md (compile, ruff format)"
python scripts/check_doc_code.py
echo "== mypy --strict (pyproject's files: the package, tests, bench, examples, scripts)"
mypy
echo "== pytest"
set +e
python -m pytest -n "${KAUDIT_TEST_WORKERS:-logical}" --durations=15 "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no test: nothing to fail" >&2
    exit 0
fi
exit "$status"
