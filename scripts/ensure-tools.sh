#!/usr/bin/env bash
# Make sure the external tools the test suite compares against are installed: today only
# h5diff (Debian's hdf5-tools), the reference for `kaudit diff`'s verdicts. Idempotent and
# quiet: does nothing when h5diff is already on PATH; otherwise runs `apt-get update` once
# and installs hdf5-tools. Exits non-zero with one line on stderr when it cannot.
set -euo pipefail

if command -v h5diff >/dev/null 2>&1; then
    exit 0
fi
fail() { echo "ensure-tools: $*" >&2; exit 1; }
command -v apt-get >/dev/null 2>&1 || fail "h5diff is missing and there is no apt-get to install hdf5-tools; install HDF5's command-line tools by hand"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        fail "h5diff is missing and installing hdf5-tools needs root (run: apt-get install hdf5-tools)"
    fi
fi
log="$(mktemp "${TMPDIR:-/tmp}/ensure-tools-XXXXXX.log")"
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >"$log" 2>&1 \
    || fail "apt-get update failed: $(tail -n 1 "$log")"
$SUDO apt-get install -y -qq --no-install-recommends hdf5-tools >"$log" 2>&1 \
    || fail "apt-get install hdf5-tools failed: $(tail -n 1 "$log")"
command -v h5diff >/dev/null 2>&1 || fail "hdf5-tools installed but h5diff is still not on PATH"
