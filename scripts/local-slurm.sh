#!/usr/bin/env bash
# A real one-node SLURM cluster on loopback, for sweep's tests, CI and local trials.
#
#   scripts/local-slurm.sh up      install (if missing) and start munged, slurmctld, slurmd; idempotent
#   scripts/local-slurm.sh down    cancel every job, stop only the processes this script started
#   scripts/local-slurm.sh status  print whether the cluster answers (exit 0 if it is up)
#   scripts/local-slurm.sh env     print the `export SLURM_CONF=...` line for this cluster
#
# Everything lives under $SWEEP_SLURM_DIR (default /tmp/sweep-slurm; no spaces allowed).
# The node has the machine's real CPU count, 90% of its memory and two fake GPUs
# (SWEEP_SLURM_GPUS), so scripts that ask for GPUs validate and run. A SPANK plugin
# accepts CSCS's `--environment=` option. The reasons behind each setting are in
# the comments where it is made.
set -euo pipefail

DIR=${SWEEP_SLURM_DIR:-/tmp/sweep-slurm}
GPUS=${SWEEP_SLURM_GPUS:-2}
CTLD_PORT=${SWEEP_SLURM_CTLD_PORT:-16817}
SLURMD_PORT=${SWEEP_SLURM_SLURMD_PORT:-16818}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CONF=$DIR/etc/slurm.conf
MUNGE_SOCKET=$DIR/munge/munge.socket.2
MARKER=SWEEP_LOCAL_SLURM_DIR   # set in slurmd's environment; its job steps inherit it
HOST=$(hostname -s)

case $DIR in *[[:space:]]*) echo "local-slurm: SWEEP_SLURM_DIR must not contain spaces: '$DIR'" >&2; exit 2 ;; esac

log() { echo "local-slurm: $*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------- processes
# PID 1 here does not reap orphans at once, so a killed daemon can linger as a
# zombie: "alive" means present, not a zombie, and running the expected program.
alive() { # alive PID COMM
    local pid=$1 comm=$2 state
    [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] || return 1
    state=$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$pid/stat" 2>/dev/null) || return 1
    [ "$state" != Z ] && [ "$state" != X ]
}

pid_of() { cat "$DIR/run/$1.pid" 2>/dev/null || true; }

daemon_alive() { alive "$(pid_of "$1")" "$1"; }

stop_daemon() { # stop_daemon NAME
    local pid
    pid=$(pid_of "$1")
    if alive "$pid" "$1"; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do alive "$pid" "$1" || break; sleep 0.1; done
        alive "$pid" "$1" && kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$DIR/run/$1.pid"
}

descendants() { # every process below PID, deepest last
    local parent=$1 child
    for child in $(ps -o pid= --ppid "$parent" 2>/dev/null); do
        echo "$child"
        descendants "$child"
    done
}

# Job steps survive slurmd (slurmstepd is detached): find the ones that carry our marker.
our_stepds() {
    local p
    for p in /proc/[0-9]*; do
        [ "$(cat "$p/comm" 2>/dev/null)" = slurmstepd ] || continue
        if { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -qx "$MARKER=$DIR"; then
            basename "$p"
        fi
    done
}

# ---------------------------------------------------------------- health
export SLURM_CONF=$CONF

healthy() {
    [ -f "$CONF" ] || return 1
    daemon_alive munged && daemon_alive slurmctld && daemon_alive slurmd || return 1
    scontrol ping 2>/dev/null | grep -q 'is UP' || return 1
    local state
    state=$(sinfo -h -n "$HOST" -o '%t' 2>/dev/null | head -n1)
    case $state in idle | mix | alloc | comp) return 0 ;; *) return 1 ;; esac
}

# ---------------------------------------------------------------- install
install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    [ -f /usr/include/slurm/spank.h ] || missing+=(libslurm-dev)
    command -v gcc >/dev/null || missing+=(gcc)
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "missing packages (${missing[*]}); run as root or install them with apt-get"
    log "installing ${missing[*]} from Debian packages"
    # The packages' postinst scripts try to start the system-wide services; a
    # policy-rc.d that answers 101 stops that. Only add one if none exists.
    local policy=/usr/sbin/policy-rc.d added=0
    if [ ! -e $policy ]; then
        printf '#!/bin/sh\nexit 101\n' >$policy && chmod 0755 $policy && added=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"/tmp/local-slurm-apt.log" 2>&1 ||
        { [ $added -eq 1 ] && rm -f $policy; cat /tmp/local-slurm-apt.log >&2; die "apt-get install failed"; }
    [ $added -eq 1 ] && rm -f $policy
    return 0
}

# ---------------------------------------------------------------- configure
write_config() {
    mkdir -p "$DIR"/{etc,run,log,state,spool,fakedev,munge}
    chmod 0700 "$DIR/etc" "$DIR/state" "$DIR/spool"
    chmod 0755 "$DIR" "$DIR/munge" # munged refuses a socket directory without o+x

    if [ ! -s "$DIR/munge/munge.key" ]; then
        dd if=/dev/urandom bs=1 count=1024 of="$DIR/munge/munge.key" status=none
    fi
    chmod 0400 "$DIR/munge/munge.key"

    # gres/gpu needs character devices: symlinks to /dev/null pass that check.
    local i
    for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$DIR/fakedev/nvidia$i"; done

    local cpus mem_mb
    cpus=$(nproc)
    mem_mb=$(awk '/MemTotal/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)

    if [ ! -f "$DIR/spank_environment.so" ] || [ "$HERE/spank_environment.c" -nt "$DIR/spank_environment.so" ]; then
        gcc -shared -fPIC -O2 -o "$DIR/spank_environment.so" "$HERE/spank_environment.c"
    fi
    echo "optional $DIR/spank_environment.so" >"$DIR/etc/plugstack.conf"

    local gres_line="" node_gres="" gres_types=""
    if [ "$GPUS" -gt 0 ]; then
        gres_types="GresTypes=gpu"
        node_gres="Gres=gpu:$GPUS"
        gres_line="NodeName=$HOST Name=gpu File=$DIR/fakedev/nvidia[0-$((GPUS - 1))]"
    fi
    echo "$gres_line" >"$DIR/etc/gres.conf"
    printf 'CgroupPlugin=autodetect\nIgnoreSystemd=yes\n' >"$DIR/etc/cgroup.conf"

    cat >"$CONF" <<EOF
# Written by scripts/local-slurm.sh: a one-node cluster on loopback for sweep's tests.
ClusterName=sweeplocal
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
PlugStackConfig=$DIR/etc/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.log
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
DependencyParameters=kill_invalid_depend
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
KillWait=5
MailProg=/bin/true
$gres_types
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem_mb $node_gres State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=normal Nodes=ALL MaxTime=INFINITE State=UP
# A partition with a time limit, for the plan-time checks against one.
PartitionName=short Nodes=ALL MaxTime=10 State=UP
EOF

    # Clients without SLURM_CONF read /etc/slurm/slurm.conf; point it here if that path is free.
    if [ ! -e /etc/slurm/slurm.conf ] && [ -w /etc ]; then
        mkdir -p /etc/slurm && ln -s "$CONF" /etc/slurm/slurm.conf
    fi
}

# ---------------------------------------------------------------- start / stop
start_daemons() {
    if ! daemon_alive munged; then
        rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
        setsid munged --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" \
            --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
            --seed-file="$DIR/munge/munge.seed" </dev/null >>"$DIR/log/munged.out" 2>&1 ||
            die "munged did not start; see $DIR/log/munged.log"
        for _ in $(seq 50); do [ -S "$MUNGE_SOCKET" ] && break; sleep 0.1; done
    fi
    if ! daemon_alive slurmctld; then
        # A cluster that died without `down` (a rebooted or restored machine)
        # left its job records behind; with no job step of ours alive they are
        # stale, and restoring them would show old jobs as if they were new.
        if [ -z "$(our_stepds)" ] && ! daemon_alive slurmd; then
            rm -rf "$DIR/state" "$DIR/spool"
            mkdir -p "$DIR/state" "$DIR/spool" && chmod 0700 "$DIR/state" "$DIR/spool"
        fi
        setsid slurmctld -f "$CONF" </dev/null >>"$DIR/log/slurmctld.out" 2>&1 ||
            die "slurmctld did not start; see $DIR/log/slurmctld.log"
    fi
    if ! daemon_alive slurmd; then
        env "$MARKER=$DIR" setsid slurmd -f "$CONF" </dev/null >>"$DIR/log/slurmd.out" 2>&1 ||
            die "slurmd did not start; see $DIR/log/slurmd.log"
    fi
}

wait_ready() {
    # slurmctld daemonizes before it can fail, so its exit status proves nothing: poll.
    for _ in $(seq 150); do
        healthy && return 0
        sleep 0.1
    done
    log "cluster did not become ready; last lines of the logs:"
    tail -n 5 "$DIR"/log/*.log >&2 || true
    return 1
}

smoke_test() {
    # The first scheduling pass comes ~3 s after slurmctld starts: run one job so
    # that when `up` returns, jobs run at once.
    local out
    out=$(sbatch --wait --parsable --job-name=local-slurm-smoke --output=/dev/null --wrap=true 2>&1) ||
        die "smoke job failed: $out"
}

cmd_up() {
    if healthy; then
        log "already up ($DIR)"
        echo "export SLURM_CONF=$CONF"
        return 0
    fi
    install_packages
    write_config
    start_daemons
    wait_ready || die "not ready"
    smoke_test
    log "up: node $HOST with $(nproc) CPUs and $GPUS fake GPUs ($DIR)"
    echo "export SLURM_CONF=$CONF"
}

cmd_down() {
    if [ -f "$CONF" ] && daemon_alive slurmctld; then
        local jobs
        jobs=$(squeue -h -o '%A' 2>/dev/null | sort -u | tr '\n' ' ')
        if [ -n "${jobs// /}" ]; then
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            for _ in $(seq 50); do
                [ -z "$(squeue -h -t running,completing -o %A 2>/dev/null)" ] && break
                sleep 0.1
            done
        fi
    fi
    stop_daemon slurmd
    stop_daemon slurmctld
    local pid
    for pid in $(our_stepds); do
        for p in $(descendants "$pid") "$pid"; do kill -KILL "$p" 2>/dev/null || true; done
    done
    stop_daemon munged
    if [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$CONF" ]; then
        rm -f /etc/slurm/slurm.conf
    fi
    # State goes with the cluster: job ids start again on the next `up`.
    rm -rf "$DIR/state" "$DIR/spool" "$DIR/run"
    log "down"
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) if healthy; then log "up ($DIR)"; else log "down"; exit 1; fi ;;
env) echo "export SLURM_CONF=$CONF" ;;
*)
    echo "usage: $0 up|down|status|env" >&2
    exit 2
    ;;
esac
