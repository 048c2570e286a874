#!/usr/bin/env bash
# Make sure the machine's programs the test suite runs are installed, from Debian's packages:
#   hdf5-tools      h5diff, the reference for `kaudit diff`'s verdicts
#   chromium        the headless browser that opens `kaudit report`'s HTML
#   openssh-server  sshd, run privately on 127.0.0.1 by the storage tests (tests/sshd.py)
#   strace          records the system calls of a commit (tests/runtime/test_commit_syscalls.py)
#   munge slurmctld slurmd slurm-client
#                   the single-node Slurm cluster of scripts/slurm.sh
#
#   bash scripts/ensure-tools.sh                 every package above
#   bash scripts/ensure-tools.sh PACKAGE...      only these (ensure-sshd.sh, slurm.sh)
#
# Idempotent and quiet: does nothing for a program already there; otherwise runs one
# `apt-get update` and one `apt-get install` of every package missing. scripts/test.sh
# starts it in the background before setting up the environment, so the tests find their
# programs installed instead of each waiting for its own apt run. No service is started:
# while the packages install, a temporary /usr/sbin/policy-rc.d (exit 101, Debian's "start
# no service" switch, honoured by invoke-rc.d) is in place if there is none, so that no
# postinst starts a system sshd on port 22 or a munged and slurmd configured from /etc; it
# is removed afterwards. Exits non-zero with one line on stderr when it cannot install.
set -euo pipefail

fail() { echo "ensure-tools: $*" >&2; exit 1; }

# the Debian package -> what shows it is installed (a command on PATH, or a file)
declare -A PROVIDES=(
    [hdf5-tools]=h5diff
    [chromium]=chromium
    [openssh-server]=/usr/sbin/sshd
    [strace]=strace
    [munge]=/usr/sbin/munged
    [slurmctld]=/usr/sbin/slurmctld
    [slurmd]=/usr/sbin/slurmd
    [slurm-client]=sbatch
)
ALL=(hdf5-tools chromium openssh-server strace munge slurmctld slurmd slurm-client)
WANTED=("$@")
[ "${#WANTED[@]}" -eq 0 ] && WANTED=("${ALL[@]}")
for package in "${WANTED[@]}"; do
    [ -n "${PROVIDES[$package]:-}" ] || fail "unknown package $package (known: ${ALL[*]})"
done

present() {
    case "$1" in
    /*) [ -x "$1" ] ;;
    *) command -v "$1" >/dev/null 2>&1 ;;
    esac
}
find_missing() {
    missing=()
    for package in "${WANTED[@]}"; do
        present "${PROVIDES[$package]}" || missing+=("$package")
    done
}
find_missing
[ "${#missing[@]}" -eq 0 ] && exit 0

command -v apt-get >/dev/null 2>&1 \
    || fail "missing ${missing[*]} and there is no apt-get to install them; install them by hand"
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        fail "installing ${missing[*]} needs root (run: apt-get install ${missing[*]})"
    fi
fi
# Serialise concurrent callers (the test suite's workers, test.sh's background run): one
# apt run at a time, and the programs looked for again under the lock. apt-get waits for a
# dpkg lock another installer holds instead of failing at once.
exec 9>"${TMPDIR:-/tmp}/ensure-tools.$(id -u).lock"
flock -w 600 9 || fail "timed out waiting for another ensure-tools run"
find_missing
[ "${#missing[@]}" -eq 0 ] && exit 0
log="$(mktemp "${TMPDIR:-/tmp}/ensure-tools-XXXXXX.log")"
POLICY=/usr/sbin/policy-rc.d
made_policy=0
cleanup() {
    if [ "$made_policy" -eq 1 ]; then "${SUDO[@]}" rm -f "$POLICY"; fi
    rm -f "$log"
}
trap cleanup EXIT
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# temporary, from kronos-audit scripts/ensure-tools.sh\nexit 101\n' |
        "${SUDO[@]}" tee "$POLICY" >/dev/null
    "${SUDO[@]}" chmod 755 "$POLICY"
    made_policy=1
fi
APT=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300)
"${SUDO[@]}" "${APT[@]}" update -qq >"$log" 2>&1 \
    || fail "apt-get update failed: $(tail -n 1 "$log")"
"${SUDO[@]}" "${APT[@]}" install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1 \
    || fail "apt-get install ${missing[*]} failed: $(tail -n 1 "$log")"
for package in "${missing[@]}"; do
    present "${PROVIDES[$package]}" \
        || fail "$package installed but ${PROVIDES[$package]} is still not there"
done
