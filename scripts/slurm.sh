#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for the tests that run real batch jobs
# (tests/slurm/) and for trying docs/cluster.md by hand.
#
#   bash scripts/slurm.sh start    install (once), configure and start; wait until the node is idle
#   bash scripts/slurm.sh stop     stop the daemons this script started
#   bash scripts/slurm.sh status   exit 0 when the cluster answers and its node is idle
#
# Debian's slurm-wlm (slurmctld, slurmd, slurm-client) and munge; installed with apt-get when
# missing (as root, or with passwordless sudo). Everything the cluster writes lives in one
# directory of its own, $KAUDIT_SLURM_DIR (default: /tmp/kaudit-slurm-<uid>): its slurm.conf,
# a munge key and socket, the controller's state, the daemons' spool, logs and pid files.
# Nothing in /etc is configured and no system service is started, so it neither needs nor
# disturbs a cluster the machine may belong to. Use it with
#
#   export SLURM_CONF="$KAUDIT_SLURM_DIR/slurm.conf"   # then sbatch, squeue, scontrol, ...
#
# One cluster per machine, whichever clone of the repository starts it: its ports are the
# machine's, and any clone's jobs can run on it (a job runs in the directory it names).
# The controller and the node daemon listen on 127.0.0.1, ports $KAUDIT_SLURM_PORT (default
# 6817) and the next one. No cgroups (a container has none to give): processes are tracked
# through /proc (proctrack/linuxproc), tasks are not bound (task/none), usage is not gathered.
# The one partition ("debug", the default) is this host with its real CPU count and memory,
# as `slurmd -C` reports them.
#
# Idempotent: `start` starts only what is not running (and restarts the daemons when the
# configuration it generates has changed); several callers at once are serialised by a lock.
# `start` prints two lines on stdout: "started" or "running", then "SLURM_CONF=<path>". On
# failure: one line on stderr saying why, exit 1.
set -euo pipefail

DIR="${KAUDIT_SLURM_DIR:-/tmp/kaudit-slurm-$(id -u)}"
PORT="${KAUDIT_SLURM_PORT:-6817}"
WAIT_SECONDS=60 # for the node to come up idle: it takes a second or two

die() {
    echo "slurm.sh: $*" >&2
    exit 1
}

case "${1:-}" in
start | stop | status) ;;
*)
    echo "usage: bash scripts/slurm.sh start|stop|status" >&2
    exit 2
    ;;
esac

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    # slurmd must be root to start jobs (it switches to the submitting user); so must apt-get.
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        die "a Slurm cluster needs root (slurmd runs jobs as their user): run as root or with passwordless sudo"
    fi
fi

CONF="$DIR/slurm.conf"
SOCKET="$DIR/munge/munge.socket"

# ---------------------------------------------------------------------------- install

install() {
    local missing=()
    command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || missing+=(munge)
    [ -x /usr/sbin/slurmctld ] || missing+=(slurmctld)
    [ -x /usr/sbin/slurmd ] || missing+=(slurmd)
    command -v sbatch >/dev/null 2>&1 || missing+=(slurm-client)
    [ "${#missing[@]}" -eq 0 ] && return 0
    command -v apt-get >/dev/null 2>&1 ||
        die "missing ${missing[*]} and there is no apt-get: install Slurm and munge by hand"
    local log policy=/usr/sbin/policy-rc.d made_policy=0
    log="$(mktemp "${TMPDIR:-/tmp}/slurm-install.XXXXXX.log")"
    # Debian's "start no service" switch while the packages install: their postinst would
    # otherwise start a system munged and slurmd configured from /etc, which this cluster
    # does not use. Removed again afterwards (only if this script put it there).
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# temporary, from kronos-audit scripts/slurm.sh\nexit 101\n' |
            "${SUDO[@]}" tee "$policy" >/dev/null
        "${SUDO[@]}" chmod 755 "$policy"
        made_policy=1
    fi
    local status=0
    {
        DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=300 update -qq &&
            DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
                --no-install-recommends "${missing[@]}"
    } >"$log" 2>&1 || status=$?
    [ "$made_policy" -eq 1 ] && "${SUDO[@]}" rm -f "$policy"
    if [ "$status" -ne 0 ]; then
        local why
        why="$(grep -E '^(E|W):' "$log" | tail -n 1 || true)"
        rm -f "$log"
        die "apt-get install ${missing[*]} failed: ${why:-see apt-get output}"
    fi
    rm -f "$log"
    [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v sbatch >/dev/null ||
        die "installed ${missing[*]} but slurmctld, slurmd or sbatch is still missing"
}

# ---------------------------------------------------------------------- configuration

# The node as slurmd sees it: "NodeName=vm CPUs=2 Boards=1 ... RealMemory=24105" (the first
# line of `slurmd -C`; its second is the uptime).
node_line() {
    local line
    line="$(/usr/sbin/slurmd -C 2>/dev/null | head -n 1)" ||
        die "slurmd -C failed: cannot tell this host's CPUs and memory"
    case "$line" in
    NodeName=*CPUs=*RealMemory=*) echo "$line" ;;
    *) die "slurmd -C printed no node description (got: ${line:-nothing})" ;;
    esac
}

# slurm.conf, written to $CONF.new (compared with the one in use by the caller).
write_config() {
    local node name
    node="$(node_line)"
    name="${node%% *}"
    name="${name#NodeName=}"
    # A Unix socket's path holds at most 107 bytes.
    [ "${#SOCKET}" -le 100 ] ||
        die "$DIR is too deep for munge's socket path (${#SOCKET} bytes): set KAUDIT_SLURM_DIR to a shorter directory"
    cat >"$CONF.new" <<EOF
# Generated by scripts/slurm.sh: a single-node cluster on 127.0.0.1. Edits are overwritten.
ClusterName=kaudit
SlurmctldHost=$name(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job waits this long (plus one second) before it may start again;
# Slurm's default, 120 s, is for clusters whose nodes are slow to launch, not for one host.
AuthInfo=socket=$SOCKET,cred_expire=5
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# No cgroups in a container: track processes through /proc, bind no task, gather no usage.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Look for a job to start every second, not every minute: a requeued job becomes eligible
# after cred_expire and would otherwise wait for the next periodic pass.
SchedulerParameters=sched_interval=1,bf_interval=1
# Keep a finished job's record (for scontrol show job) five minutes.
MinJobAge=300
ReturnToService=2
SlurmdTimeout=60
SlurmctldTimeout=60
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$name Default=YES MaxTime=INFINITE State=UP
EOF
}

# ------------------------------------------------------------------------- processes

# The pid in pid file $1 when that process is alive and is command $2 (guards against a
# stale pid file whose pid was reused).
alive() {
    local pid
    pid="$(cat "$1" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
    echo "$pid"
}

stop_one() { # pidfile command
    local pid i
    pid="$(alive "$1" "$2")" || {
        rm -f "$1"
        return 0
    }
    "${SUDO[@]}" kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 100); do
        [ -e "/proc/$pid" ] || break
        sleep 0.1
    done
    if [ -e "/proc/$pid" ]; then
        "${SUDO[@]}" kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$1"
}

log_tail() { # logfile
    [ -f "$1" ] && tail -n 1 "$1" | sed 's/^\[[^]]*\] //' || echo "no log"
}

start_munge() {
    alive "$DIR/run/munged.pid" munged >/dev/null && return 0
    local key="$DIR/munge/munge.key"
    if [ ! -s "$key" ]; then
        (umask 077 && head -c 1024 /dev/urandom >"$key.new" && mv "$key.new" "$key")
    fi
    rm -f "$SOCKET" "$SOCKET.lock"
    "${SUDO[@]}" /usr/sbin/munged --force --socket="$SOCKET" --key-file="$key" \
        --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munged.seed" 9>&- ||
        die "munged did not start: $(log_tail "$DIR/log/munged.log")"
}

start_daemon() { # command
    local cmd="$1" pidfile="$DIR/run/$1.pid" i
    alive "$pidfile" "$cmd" >/dev/null && return 0
    case "$cmd" in
    slurmctld) "${SUDO[@]}" /usr/sbin/slurmctld -f "$CONF" ;;
    slurmd) "${SUDO[@]}" /usr/sbin/slurmd -f "$CONF" ;;
    esac >"$DIR/log/$cmd.out" 2>&1 9>&- ||
        die "$cmd did not start: $(tail -n 1 "$DIR/log/$cmd.out" 2>/dev/null) $(log_tail "$DIR/log/$cmd.log")"
    # The daemon forks and writes its pid file: wait for it, and for it to stay up.
    for i in $(seq 50); do
        alive "$pidfile" "$cmd" >/dev/null && return 0
        sleep 0.1
    done
    die "$cmd exited at start: $(log_tail "$DIR/log/$cmd.log")"
}

node_state() {
    timeout 10 sinfo --noheader --Node --format=%T 2>/dev/null | head -n 1
}

wait_idle() {
    local deadline=$((SECONDS + WAIT_SECONDS)) state=""
    while [ "$SECONDS" -lt "$deadline" ]; do
        state="$(node_state || true)"
        case "$state" in
        idle | mixed | allocated | completing) return 0 ;;
        drained* | draining* | down*)
            # A node the controller set down before slurmd registered comes back by itself
            # (ReturnToService=2); one drained for a reason does not: say the reason.
            local reason
            reason="$(sinfo --noheader --list-reasons --format=%E 2>/dev/null | head -n 1)"
            [ -n "$reason" ] && die "the node is $state: $reason (see $DIR/log/)"
            ;;
        esac
        # The daemons may have died meanwhile: say so rather than wait out the deadline.
        alive "$DIR/run/slurmctld.pid" slurmctld >/dev/null ||
            die "slurmctld stopped: $(log_tail "$DIR/log/slurmctld.log")"
        alive "$DIR/run/slurmd.pid" slurmd >/dev/null ||
            die "slurmd stopped: $(log_tail "$DIR/log/slurmd.log")"
        sleep 0.2
    done
    die "the node did not become idle within ${WAIT_SECONDS}s (state: ${state:-no answer}; see $DIR/log/)"
}

stop_all() {
    stop_one "$DIR/run/slurmd.pid" slurmd
    stop_one "$DIR/run/slurmctld.pid" slurmctld
    stop_one "$DIR/run/munged.pid" munged
}

running() {
    alive "$DIR/run/munged.pid" munged >/dev/null &&
        alive "$DIR/run/slurmctld.pid" slurmctld >/dev/null &&
        alive "$DIR/run/slurmd.pid" slurmd >/dev/null
}

# ------------------------------------------------------------------------------ main

# The daemons run as root with what this directory holds (their configuration, the munge
# key): it must be this user's own, a real directory that no one else can write to. Under
# /tmp anyone could have made it first, or put a symbolic link there.
mkdir -p -m 700 "$DIR" 2>/dev/null || die "cannot create $DIR"
[ -d "$DIR" ] && [ ! -L "$DIR" ] && [ "$(stat -c %u "$DIR")" = "$(id -u)" ] ||
    die "$DIR is not a directory of this user's own: remove it, or set KAUDIT_SLURM_DIR"
chmod go-w "$DIR"
# Serialise concurrent callers (two test sessions): one installs and starts, the other
# then finds it running. The daemons are started without this descriptor (9>&-): one that
# inherited it would hold the lock for as long as it runs.
exec 9>"$DIR/.lock"
flock -w 600 9 || die "timed out waiting for another scripts/slurm.sh"

case "$1" in
status)
    export SLURM_CONF="$CONF"
    running && [ -f "$CONF" ] || exit 1
    case "$(node_state || true)" in idle | mixed | allocated | completing) exit 0 ;; esac
    exit 1
    ;;
stop)
    stop_all
    ;;
start)
    install
    export SLURM_CONF="$CONF"
    mkdir -p "$DIR/munge" "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/log"
    chmod 700 "$DIR/munge"
    was_running=0
    running && was_running=1
    write_config
    if [ -f "$CONF" ] && cmp -s "$CONF" "$CONF.new"; then
        rm -f "$CONF.new"
    else
        mv "$CONF.new" "$CONF"
        # A changed configuration (first start, other memory, another port): the daemons
        # read it at start, so restart those that run.
        stop_one "$DIR/run/slurmd.pid" slurmd
        stop_one "$DIR/run/slurmctld.pid" slurmctld
        was_running=0
    fi
    start_munge
    start_daemon slurmctld
    start_daemon slurmd
    wait_idle
    if [ "$was_running" -eq 1 ]; then echo running; else echo started; fi
    echo "SLURM_CONF=$CONF"
    ;;
esac
