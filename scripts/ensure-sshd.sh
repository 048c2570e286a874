#!/usr/bin/env bash
# Make sure an OpenSSH server binary (/usr/sbin/sshd) exists, for the storage tests that
# run a private sshd on 127.0.0.1 (tests/sshd.py). Installs Debian's openssh-server when
# it is missing, through scripts/ensure-tools.sh; does nothing (and prints nothing) when it
# is already there.
#
# It never starts, enables or configures the system's ssh service itself: ensure-tools.sh
# lets no package start a service while it installs, so the package's postinst cannot
# start an sshd on port 22. /etc/ssh gets only what the package itself writes
# (sshd_config and host keys).
#
# Exit 0: sshd is there. Exit 1: it is not and could not be installed (reason on stderr).
set -euo pipefail

SSHD="${SSHD:-/usr/sbin/sshd}"
[ -x "$SSHD" ] && exit 0

why="$(bash "$(dirname "${BASH_SOURCE[0]}")/ensure-tools.sh" openssh-server 2>&1 >/dev/null)" || {
    echo "ensure-sshd: ${why#ensure-tools: }" >&2
    exit 1
}
[ -x "$SSHD" ] || { echo "ensure-sshd: openssh-server installed but $SSHD is still missing" >&2; exit 1; }
