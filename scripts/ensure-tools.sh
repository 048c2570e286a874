#!/usr/bin/env bash
# Make sure the external tools the test suite runs are installed: h5diff (Debian's
# hdf5-tools), the reference for `kaudit diff`'s verdicts, and chromium (Debian's chromium),
# the headless browser that opens `kaudit report`'s HTML. Idempotent and quiet: does nothing
# for a tool already on PATH; otherwise runs `apt-get update` once and installs the package.
# Exits non-zero with one line on stderr when it cannot.
set -euo pipefail

fail() { echo "ensure-tools: $*" >&2; exit 1; }

# command on PATH -> the Debian package that provides it
TOOLS=("h5diff hdf5-tools" "chromium chromium")
find_missing() {
    missing=()
    for entry in "${TOOLS[@]}"; do
        read -r tool package <<<"$entry"
        command -v "$tool" >/dev/null 2>&1 || missing+=("$package")
    done
}
find_missing
[ "${#missing[@]}" -eq 0 ] && exit 0

command -v apt-get >/dev/null 2>&1 \
    || fail "missing ${missing[*]} and there is no apt-get to install them; install them by hand"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        fail "installing ${missing[*]} needs root (run: apt-get install ${missing[*]})"
    fi
fi
# Serialise concurrent callers (the test suite's workers): one apt run at a time, and the
# tools looked for again under the lock. apt-get waits for a dpkg lock another installer
# (scripts/ensure-sshd.sh, scripts/slurm.sh) holds instead of failing at once.
exec 9>"${TMPDIR:-/tmp}/ensure-tools.$(id -u).lock"
flock -w 600 9 || fail "timed out waiting for another ensure-tools run"
find_missing
[ "${#missing[@]}" -eq 0 ] && exit 0
log="$(mktemp "${TMPDIR:-/tmp}/ensure-tools-XXXXXX.log")"
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=300 update -qq >"$log" 2>&1 \
    || fail "apt-get update failed: $(tail -n 1 "$log")"
$SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1 \
    || fail "apt-get install ${missing[*]} failed: $(tail -n 1 "$log")"
for entry in "${TOOLS[@]}"; do
    read -r tool package <<<"$entry"
    command -v "$tool" >/dev/null 2>&1 || fail "$package installed but $tool is still not on PATH"
done
