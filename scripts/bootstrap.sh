# Sourced by demo.sh and test.sh: make .venv with kronos-audit (editable) and its test tools.
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
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$ROOT[test]"
export PATH="$VENV/bin:$PATH"
export DVC_NO_ANALYTICS=1
