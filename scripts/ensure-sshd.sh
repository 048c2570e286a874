#!/usr/bin/env bash
# Make sure an OpenSSH server binary (/usr/sbin/sshd) exists, for the storage tests that
# run a private sshd on 127.0.0.1 (tests/sshd.py). Installs Debian's openssh-server when
# it is missing; does nothing (and prints nothing) when it is already there.
#
# It never starts, enables or configures the system's ssh service itself. While the
# package is installed, a temporary /usr/sbin/policy-rc.d (exit 101, Debian's standard
# "do not start services" switch, honoured by invoke-rc.d and deb-systemd-invoke) is put
# in place if none exists, so the package's postinst cannot start an sshd on port 22;
# it is removed again afterwards. /etc/ssh gets only what the package itself writes
# (sshd_config and host keys).
#
# Exit 0: sshd is there. Exit 1: it is not and could not be installed (reason on stderr).
set -euo pipefail

SSHD="${SSHD:-/usr/sbin/sshd}"
[ -x "$SSHD" ] && exit 0

die() {
    echo "ensure-sshd: $*" >&2
    exit 1
}

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        die "$SSHD is missing and installing openssh-server needs root (or passwordless sudo)"
    fi
fi
command -v apt-get >/dev/null 2>&1 ||
    die "$SSHD is missing and apt-get is not available: install an OpenSSH server by hand"

LOG="$(mktemp "${TMPDIR:-/tmp}/ensure-sshd.XXXXXX.log")"
POLICY=/usr/sbin/policy-rc.d
made_policy=0
cleanup() {
    if [ "$made_policy" -eq 1 ]; then
        "${SUDO[@]}" rm -f "$POLICY"
    fi
    rm -f "$LOG"
}
trap cleanup EXIT

fail() {
    echo "ensure-sshd: $1; apt output:" >&2
    tail -n 25 "$LOG" >&2 || true
    exit 1
}

# Serialise concurrent test sessions: one apt run at a time, and re-check under the lock.
exec 9>"${TMPDIR:-/tmp}/ensure-sshd.$(id -u).lock"
flock -w 600 9 || die "timed out waiting for another ensure-sshd run"
[ -x "$SSHD" ] && exit 0

if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# temporary, from kronos-audit scripts/ensure-sshd.sh\nexit 101\n' |
        "${SUDO[@]}" tee "$POLICY" >/dev/null
    "${SUDO[@]}" chmod 755 "$POLICY"
    made_policy=1
fi

APT=(apt-get -q -o DPkg::Lock::Timeout=300)
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive "${APT[@]}" update >"$LOG" 2>&1 ||
    fail "apt-get update failed"
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y \
    --no-install-recommends openssh-server >>"$LOG" 2>&1 ||
    fail "apt-get install openssh-server failed"

[ -x "$SSHD" ] || fail "openssh-server installed but $SSHD is still missing"
exit 0
