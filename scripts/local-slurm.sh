#!/usr/bin/env bash
# A real SLURM cluster on this machine, for sweep's tests, CI and local trials:
# one node on loopback (the default), or several nodes, each a host of its own.
#
#   scripts/local-slurm.sh up [--nodes N] [--link-gbps G]
#                                  install (if missing) and start munged, slurmctld and
#                                  N slurmd (default 1); idempotent
#   scripts/local-slurm.sh down    cancel every job, stop only the processes this script
#                                  started, remove only the namespaces and links it made
#   scripts/local-slurm.sh status  print whether the cluster answers (exit 0 if it is up)
#   scripts/local-slurm.sh env     print the `export SLURM_CONF=...` line for this cluster
#   scripts/local-slurm.sh kill-node NAME
#                                  lose node NAME (N > 1): its link goes down and every
#                                  process on it is killed; `up` brings it back
#   scripts/local-slurm.sh cut-link NAME
#                                  node NAME's link goes down, its processes run on
#                                  (a dead NIC or switch port); `up` brings it back
#
# Everything lives under $SWEEP_SLURM_DIR (default /tmp/sweep-slurm; no spaces allowed).
# Each node has the machine's real CPU count, 90% of its memory and two fake GPUs
# (SWEEP_SLURM_GPUS), so scripts that ask for GPUs validate and run. A SPANK plugin
# accepts CSCS's `--environment=` option.
#
# With --nodes N > 1 (root only) each node node1..nodeN is a network namespace
# and a UTS namespace of its own (its own address and host name, so MPI between
# nodes goes over TCP on a real link) on a bridge that the script creates, with
# the controller on the bridge; --link-gbps G shapes each node's link to G
# Gbit/s each way (tc token bucket). The subnet is SWEEP_SLURM_SUBNET (three
# octets, default derived from the directory, so that two clusters do not
# meet). No address is added anywhere else, and nodes have no route out.
# The reasons behind each setting are in the comments where it is made.
set -euo pipefail

DIR=${SWEEP_SLURM_DIR:-/tmp/sweep-slurm}
GPUS=${SWEEP_SLURM_GPUS:-2}
# Ports: as given, else as the cluster in $DIR was started with (so that `up`
# of a running cluster keeps them), else the defaults.
recorded_port() { { sed -n "s/^$1=\([0-9]*\)\$/\1/p" "$DIR/etc/slurm.conf" 2>/dev/null || true; } | head -n1; }
CTLD_PORT=${SWEEP_SLURM_CTLD_PORT:-$(recorded_port SlurmctldPort)}
CTLD_PORT=${CTLD_PORT:-16817}
SLURMD_PORT=${SWEEP_SLURM_SLURMD_PORT:-$(recorded_port SlurmdPort)}
SLURMD_PORT=${SLURMD_PORT:-16818}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CONF=$DIR/etc/slurm.conf
MUNGE_SOCKET=$DIR/munge/munge.socket.2
MARKER=SWEEP_LOCAL_SLURM_DIR   # set in slurmd's environment; its job steps inherit it
HOST=$(hostname -s)
COMMAND=${1:-}
[ $# -gt 0 ] && shift

case $DIR in *[[:space:]]*) echo "local-slurm: SWEEP_SLURM_DIR must not contain spaces: '$DIR'" >&2; exit 2 ;; esac

usage() {
    echo "usage: $0 up [--nodes N] [--link-gbps G] | down | status | env | kill-node NAME | cut-link NAME" >&2
    exit 2
}

# The topology asked for (up) or recorded (every other command).
NODES=1
LINK_GBPS=
KILL_NODE=
if [ "$COMMAND" = up ]; then
    while [ $# -gt 0 ]; do
        case $1 in
        --nodes) [ $# -ge 2 ] || usage; NODES=$2; shift 2 ;;
        --nodes=*) NODES=${1#--nodes=}; shift ;;
        --link-gbps) [ $# -ge 2 ] || usage; LINK_GBPS=$2; shift 2 ;;
        --link-gbps=*) LINK_GBPS=${1#--link-gbps=}; shift ;;
        *) usage ;;
        esac
    done
    [[ $NODES =~ ^[0-9]{1,2}$ ]] && [ "$((10#$NODES))" -ge 1 ] && [ "$((10#$NODES))" -le 16 ] ||
        { echo "local-slurm: --nodes takes a whole number from 1 to 16, not '$NODES'" >&2; exit 2; }
    NODES=$((10#$NODES))
    if [ -n "$LINK_GBPS" ]; then
        [[ $LINK_GBPS =~ ^[0-9]{1,4}(\.[0-9]{1,3})?$ ]] && awk -v g="$LINK_GBPS" 'BEGIN { exit !(g > 0) }' ||
            { echo "local-slurm: --link-gbps takes a bandwidth in Gbit/s above 0 (e.g. 0.5), not '$LINK_GBPS'" >&2; exit 2; }
        [ "$NODES" -gt 1 ] || { echo "local-slurm: --link-gbps shapes the links between nodes: it needs --nodes 2 or more" >&2; exit 2; }
    fi
else
    if [ "$COMMAND" = kill-node ] || [ "$COMMAND" = cut-link ]; then
        [ $# -eq 1 ] || usage
        KILL_NODE=$1
    else
        [ $# -eq 0 ] || usage
    fi
    NODES=$(cat "$DIR/etc/nodes" 2>/dev/null || echo 1)
    [[ $NODES =~ ^[0-9]{1,2}$ ]] && NODES=$((10#$NODES)) || NODES=1
    LINK_GBPS=$(cat "$DIR/etc/link-gbps" 2>/dev/null || true)
fi

log() { echo "local-slurm: $*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------- nodes and their network
# One node: this host, on loopback. Several: node1..nodeN, each in namespaces
# named from a tag of $DIR, so that two clusters never share one.
TAG=$(printf %s "$DIR" | cksum | awk '{ printf "%04x", $1 % 65536 }')
BRIDGE=swb$TAG
SUBNET=${SWEEP_SLURM_SUBNET:-10.213.$((0x$TAG % 200 + 20))}
[[ $SUBNET =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] ||
    { echo "local-slurm: SWEEP_SLURM_SUBNET is three octets (e.g. 10.213.7), not '$SUBNET'" >&2; exit 2; }
CREATED=$DIR/run/created # what `up` made, a line each ("netns NAME", "link NAME"): all that `down` removes

multi() { [ "$NODES" -gt 1 ]; }
node_name() { if multi; then echo "node$1"; else echo "$HOST"; fi; }
node_addr() { if multi; then echo "$SUBNET.$((10 + $1))"; else echo 127.0.0.1; fi; }
ctl_addr() { if multi; then echo "$SUBNET.1"; else echo 127.0.0.1; fi; }
netns_of() { echo "sweep-$TAG-node$1"; }
veth_of() { echo "swv$TAG-$1"; } # the bridge's end; the node's end is its eth0
slurmd_pid_name() { if multi; then echo "slurmd-node$1"; else echo slurmd; fi; }

record() { grep -qxF "$*" "$CREATED" 2>/dev/null || echo "$*" >>"$CREATED"; }

create_network() {
    [ "$(id -u)" -eq 0 ] || die "--nodes $NODES needs root: each node is a network namespace"
    mkdir -p "$DIR/run" "$DIR/etc"
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        if ip -4 -o addr show | grep -q " inet $SUBNET\."; then
            die "the subnet $SUBNET.0/24 is already in use on this machine: choose another with SWEEP_SLURM_SUBNET"
        fi
        ip link add "$BRIDGE" type bridge || die "could not create the bridge $BRIDGE (are network namespaces allowed here?)"
        record link "$BRIDGE"
    fi
    ip addr replace "$(ctl_addr)/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local k ns veth
    for ((k = 1; k <= NODES; k++)); do
        ns=$(netns_of "$k") veth=$(veth_of "$k")
        if [ ! -e "/run/netns/$ns" ]; then
            ip netns add "$ns" || die "could not create the network namespace $ns"
            record netns "$ns"
        fi
        if ! ip link show "$veth" >/dev/null 2>&1; then
            ip link add "$veth" type veth peer name eth0 netns "$ns" || die "could not create the link $veth"
            record link "$veth"
        fi
        ip link set "$veth" master "$BRIDGE"
        ip -n "$ns" addr replace "$(node_addr "$k")/24" dev eth0
        ip link set "$veth" up
        ip -n "$ns" link set lo up
        ip -n "$ns" link set eth0 up
    done
    shape_links
}

# A token bucket on both ends of each node's link: G Gbit/s each way between
# any two nodes. The bucket holds 2 ms of traffic (at least 64 KiB), enough for
# the kernel's timer to keep the rate; packets wait at most 50 ms in its queue.
shape_links() {
    local k ns veth burst
    for ((k = 1; k <= NODES; k++)); do
        ns=$(netns_of "$k") veth=$(veth_of "$k")
        if [ -n "$LINK_GBPS" ]; then
            burst=$(awk -v g="$LINK_GBPS" 'BEGIN { b = g * 1e9 / 8 * 0.002; if (b < 65536) b = 65536; printf "%d", b }')
            tc qdisc replace dev "$veth" root tbf rate "${LINK_GBPS}gbit" burst "$burst" latency 50ms ||
                die "tc could not shape $veth"
            ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "${LINK_GBPS}gbit" burst "$burst" latency 50ms ||
                die "tc could not shape the eth0 of node$k"
        else
            tc qdisc del dev "$veth" root 2>/dev/null || true
            ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
        fi
    done
    echo "$LINK_GBPS" >"$DIR/etc/link-gbps"
}

# Kills every process inside a namespace this script made (nothing else lives there).
kill_in_netns() {
    local pids
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    # shellcheck disable=SC2086
    if [ -n "$pids" ]; then kill -KILL $pids 2>/dev/null || true; fi
}

remove_network() {
    [ -f "$CREATED" ] || return 0
    local kind name
    while read -r kind name; do
        if [ "$kind" = netns ]; then kill_in_netns "$name"; fi
    done <"$CREATED"
    # Links first (a namespace's end goes with its peer), then namespaces, the bridge last.
    while read -r kind name; do
        if [ "$kind" = link ] && [ "$name" != "$BRIDGE" ]; then ip link del "$name" 2>/dev/null || true; fi
    done <"$CREATED"
    while read -r kind name; do
        if [ "$kind" = netns ]; then ip netns del "$name" 2>/dev/null || true; fi
    done <"$CREATED"
    if grep -qxF "link $BRIDGE" "$CREATED"; then ip link del "$BRIDGE" 2>/dev/null || true; fi
    rm -f "$CREATED"
}

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

daemon_alive() { alive "$(pid_of "$1")" "${2:-$1}"; } # daemon_alive PIDNAME [COMM]

stop_daemon() { # stop_daemon PIDNAME [COMM]
    local pid comm=${2:-$1}
    pid=$(pid_of "$1")
    if alive "$pid" "$comm"; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do alive "$pid" "$comm" || break; sleep 0.1; done
        alive "$pid" "$comm" && kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$DIR/run/$1.pid"
}

slurmd_alive() { daemon_alive "$(slurmd_pid_name "$1")" slurmd; }

any_slurmd_alive() {
    local k
    for ((k = 1; k <= NODES; k++)); do slurmd_alive "$k" && return 0; done
    return 1
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
    daemon_alive munged && daemon_alive slurmctld || return 1
    local k state
    for ((k = 1; k <= NODES; k++)); do slurmd_alive "$k" || return 1; done
    scontrol ping 2>/dev/null | grep -q 'is UP' || return 1
    for ((k = 1; k <= NODES; k++)); do
        state=$(sinfo -h -n "$(node_name "$k")" -o '%t' 2>/dev/null | head -n1)
        case $state in idle | mix | alloc | comp) ;; *) return 1 ;; esac
    done
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
    if multi && ! { command -v ip && command -v tc; } >/dev/null; then missing+=(iproute2); fi
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
    echo "$NODES" >"$DIR/etc/nodes"

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

    local gres_types="" node_gres="" k node_lines="" gres_lines=""
    if [ "$GPUS" -gt 0 ]; then
        gres_types="GresTypes=gpu"
        node_gres="Gres=gpu:$GPUS"
    fi
    for ((k = 1; k <= NODES; k++)); do
        node_lines+="NodeName=$(node_name "$k") NodeAddr=$(node_addr "$k") CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem_mb $node_gres State=UNKNOWN"$'\n'
        if [ "$GPUS" -gt 0 ]; then
            gres_lines+="NodeName=$(node_name "$k") Name=gpu File=$DIR/fakedev/nvidia[0-$((GPUS - 1))]"$'\n'
        fi
    done
    printf '%s' "$gres_lines" >"$DIR/etc/gres.conf"
    printf 'CgroupPlugin=autodetect\nIgnoreSystemd=yes\n' >"$DIR/etc/cgroup.conf"

    # Several nodes share this machine's file system: each gets its own spool,
    # pid file, log and TmpFS (where a step's PMIx server keeps files named by
    # job and step only), by node name (%n). A lost node is set DOWN after
    # SlurmdTimeout without an answer, and its jobs end (NODE_FAIL): 30 s
    # rather than 300, so that a test can wait for it.
    local per_node description
    if multi; then
        for ((k = 1; k <= NODES; k++)); do mkdir -p "$DIR/tmp/node$k"; done
        per_node="SlurmdSpoolDir=$DIR/spool/%n
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmdLogFile=$DIR/log/slurmd-%n.log
TmpFS=$DIR/tmp/%n
SlurmdTimeout=30"
        description="$NODES nodes in network namespaces on the bridge $BRIDGE ($SUBNET.0/24)"
    else
        per_node="SlurmdSpoolDir=$DIR/spool
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmdLogFile=$DIR/log/slurmd.log"
        description="a one-node cluster on loopback"
    fi

    cat >"$CONF" <<EOF
# Written by scripts/local-slurm.sh: $description, for sweep's tests.
ClusterName=sweeplocal
SlurmctldHost=$HOST($(ctl_addr))
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
StateSaveLocation=$DIR/state
$per_node
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
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
# No DependencyParameters=kill_invalid_depend: SLURM's default, as many sites
# keep it (a job whose dependency failed stays PENDING unless it asks otherwise).
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
# Small, as some sites keep it: a study's larger arrays go out split (the tests see it).
MaxArraySize=8
KillWait=5
MailProg=/bin/true
$gres_types
${node_lines}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=normal Nodes=ALL MaxTime=INFINITE State=UP
# A partition with a time limit, for the plan-time checks against one.
PartitionName=short Nodes=ALL MaxTime=10 State=UP
EOF

    # The nodes' own /etc/hosts (bind-mounted in each node's mount namespace):
    # the nodes and the controller by name, nothing of this machine's.
    if multi; then
        {
            echo "127.0.0.1 localhost"
            echo "$(ctl_addr) $HOST"
            for ((k = 1; k <= NODES; k++)); do echo "$(node_addr "$k") $(node_name "$k")"; done
        } >"$DIR/etc/hosts"
    fi

    # Clients without SLURM_CONF read /etc/slurm/slurm.conf; point it here if that path is free.
    if [ ! -e /etc/slurm/slurm.conf ] && [ -w /etc ]; then
        mkdir -p /etc/slurm && ln -s "$CONF" /etc/slurm/slurm.conf
    fi
}

# ---------------------------------------------------------------- start / stop
start_slurmd() { # start_slurmd K
    if ! multi; then
        env "$MARKER=$DIR" setsid slurmd -f "$CONF" </dev/null >>"$DIR/log/slurmd.out" 2>&1 ||
            die "slurmd did not start; see $DIR/log/slurmd.log"
        return 0
    fi
    local name ns
    name=$(node_name "$1") ns=$(netns_of "$1")
    # A node lost with kill-node comes back with its link.
    ip link set "$(veth_of "$1")" up
    ip -n "$ns" link set eth0 up
    # Its own host name (UTS namespace) and /etc/hosts (a private mount
    # namespace: nothing mounted there is seen outside), in its network namespace.
    # nsenter rather than `ip netns exec`, which remounts /sys and so hides
    # /sys/fs/cgroup, without which slurmd does not start.
    mkdir -p "$DIR/spool/$name" && chmod 0700 "$DIR/spool/$name"
    nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private \
        env "$MARKER=$DIR" setsid bash -c 'hostname "$1" && mount --bind "$2" /etc/hosts && exec slurmd -N "$1" -f "$3"' \
        node "$name" "$DIR/etc/hosts" "$CONF" </dev/null >>"$DIR/log/slurmd-$name.out" 2>&1 ||
        die "slurmd of $name did not start; see $DIR/log/slurmd-$name.log"
}

start_daemons() {
    local k
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
        # Job ids start again from 1, so a step's PMIx directory left in a
        # node's TmpFS (PMIx does not always remove it) would make a new step
        # of the same id fail to launch ("File exists"): the TmpFS goes too.
        if [ -z "$(our_stepds)" ] && ! any_slurmd_alive; then
            rm -rf "$DIR/state" "$DIR/spool" "$DIR/tmp"
            mkdir -p "$DIR/state" "$DIR/spool" && chmod 0700 "$DIR/state" "$DIR/spool"
            if multi; then
                for ((k = 1; k <= NODES; k++)); do mkdir -p "$DIR/tmp/node$k"; done
            fi
        fi
        setsid slurmctld -f "$CONF" </dev/null >>"$DIR/log/slurmctld.out" 2>&1 ||
            die "slurmctld did not start; see $DIR/log/slurmctld.log"
    fi
    for ((k = 1; k <= NODES; k++)); do slurmd_alive "$k" || start_slurmd "$k"; done
}

wait_ready() {
    # slurmctld daemonizes before it can fail, so its exit status proves nothing: poll.
    for _ in $(seq 300); do
        healthy && return 0
        sleep 0.1
    done
    log "cluster did not become ready; last lines of the logs:"
    tail -n 5 "$DIR"/log/*.log >&2 || true
    return 1
}

smoke_test() {
    # The first scheduling pass comes ~3 s after slurmctld starts: run one job so
    # that when `up` returns, jobs run at once. On several nodes it runs a step
    # on each, which proves the links.
    local out
    out=$(sbatch --wait --parsable --job-name=local-slurm-smoke --output=/dev/null \
        --nodes="$NODES" --wrap="srun --nodes=$NODES --ntasks-per-node=1 true" 2>&1) ||
        die "smoke job failed: $out"
}

# Waits (up to a minute) until no node is DOWN for want of an answer.
wait_nodes_back() {
    local _
    for _ in $(seq 120); do
        [ -z "$(sinfo -h -N -t down,no_respond -o %N 2>/dev/null)" ] && return 0
        sleep 0.5
    done
    log "warning: $(sinfo -h -N -t down,no_respond -o %N | sort -u | tr '\n' ' ')still down"
}

cmd_up() {
    local recorded
    recorded=$(cat "$DIR/etc/nodes" 2>/dev/null || echo "$NODES")
    if [ "$recorded" != "$NODES" ] && daemon_alive slurmctld; then
        die "the cluster in $DIR is up with $recorded node(s): run '$0 down' before starting it with $NODES"
    fi
    if healthy; then
        # A link cut (cut-link) comes back; the controller hears its node
        # again at its next ping and returns it to service (ReturnToService=2).
        if multi; then create_network; shape_links; wait_nodes_back; fi
        log "already up ($DIR)"
        echo "export SLURM_CONF=$CONF"
        return 0
    fi
    install_packages
    if multi; then create_network; fi
    write_config
    start_daemons
    wait_ready || die "not ready"
    smoke_test
    if multi; then
        log "up: node1..node$NODES on $SUBNET.0/24 (links ${LINK_GBPS:-unshaped}${LINK_GBPS:+ Gbit/s}), each with $(nproc) CPUs and $GPUS fake GPUs ($DIR)"
    else
        log "up: node $HOST with $(nproc) CPUs and $GPUS fake GPUs ($DIR)"
    fi
    echo "export SLURM_CONF=$CONF"
}

# A node lost: its link goes down first (its peers hear nothing more, as when
# a real node dies), then every process in it is killed, slurmd and job steps.
cmd_kill_node() {
    multi || die "$COMMAND needs a cluster of several nodes (up --nodes N)"
    local k
    for ((k = 1; k <= NODES; k++)); do
        [ "$KILL_NODE" = "$(node_name "$k")" ] || continue
        ip link set "$(veth_of "$k")" down
        ip -n "$(netns_of "$k")" link set eth0 down
        if [ "$COMMAND" = cut-link ]; then
            log "$KILL_NODE cut off: its link is down, its processes run on ('up' brings it back)"
            return 0
        fi
        kill_in_netns "$(netns_of "$k")"
        rm -f "$DIR/run/$(slurmd_pid_name "$k").pid"
        log "$KILL_NODE lost: its link is down and its processes are killed ('up' brings it back)"
        return 0
    done
    die "no node '$KILL_NODE' in this cluster (node1..node$NODES)"
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
    local k pid p
    for ((k = 1; k <= NODES; k++)); do stop_daemon "$(slurmd_pid_name "$k")" slurmd; done
    stop_daemon slurmctld
    for pid in $(our_stepds); do
        for p in $(descendants "$pid") "$pid"; do kill -KILL "$p" 2>/dev/null || true; done
    done
    remove_network
    stop_daemon munged
    if [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$CONF" ]; then
        rm -f /etc/slurm/slurm.conf
    fi
    # State goes with the cluster: job ids start again on the next `up`.
    rm -rf "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/tmp"
    log "down"
}

case $COMMAND in
up) cmd_up ;;
down) cmd_down ;;
status)
    if ! healthy; then
        log "down"
        exit 1
    elif multi; then
        log "up ($DIR, $NODES nodes, links ${LINK_GBPS:-unshaped}${LINK_GBPS:+ Gbit/s})"
    else
        log "up ($DIR)"
    fi
    ;;
env) echo "export SLURM_CONF=$CONF" ;;
kill-node | cut-link) cmd_kill_node ;;
*) usage ;;
esac
