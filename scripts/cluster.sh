#!/usr/bin/env bash
# A real Slurm 22.05 cluster on this one machine, from Debian's packages (run as root).
#
#   bash scripts/cluster.sh up     [--nodes N] [--instance K] [--fresh]
#   bash scripts/cluster.sh down   [--instance K | --all]
#   bash scripts/cluster.sh status [--instance K]
#   bash scripts/cluster.sh env    [--instance K]      # prints: export SLURM_CONF=...
#
# Shared by every instance: munged (user munge, /run/munge), MariaDB on 127.0.0.1 and one
# slurmdbd (port 6819).  Per instance K (0..7): its own ClusterName clusterK, slurmctld on
# port 17000+100K, one `slurmd -N nI` per fake node nI on port 17000+100K+I, state, spool,
# pid and log paths, and a conf dir.  Instance 0 writes /etc/slurm/slurm.conf so plain
# `sbatch` works; instance K>0 lives in /etc/slurm-cluster/iK (clients need SLURM_CONF).
# Every node: 4 CPUs, 4 fake GPUs (gres on dummy char devices /dev/fakegpu/gpuN).
# Partitions: batch (default, whole nodes) and shared.  Facts: ../shared/SLURM-FACTS.md.
#
# Idempotent: `up` on a running instance with the same config only checks that every
# daemon answers; `down` on a stopped one succeeds.  Everything is serialised by one lock
# so several engineers (or pytest sessions) can call it at once.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
TEMPLATES="$HERE/cluster"

SHARED_RUN=/run/slurm-cluster
SHARED_LOG=/var/log/slurm-cluster
DBD_CONF=/etc/slurm/slurmdbd.conf
DBD_PORT=6819
# A local, loopback-only test database: the password only keeps slurmdbd off root's socket auth.
DB_PASS=slurm-elastic-local
MYSQL_SOCK=/run/mysqld/mysqld.sock
HOST="$(hostname -s)"
WAIT_S=${CLUSTER_WAIT_S:-40}

usage() {
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

# A daemon failed: name it, say what was expected, and show the end of its log.
died_or() { # message: "exited" when wait_daemon saw the process die, else the message
    if ((DAEMON_DIED)); then echo "exited during start-up"; else echo "$1"; fi
}

fail_daemon() {
    local daemon=$1 log=$2 what=$3
    {
        echo "cluster.sh: $daemon $what"
        if [[ -f $log ]]; then
            echo "--- last lines of $log:"
            tail -n 15 "$log"
        else
            echo "(no log at $log)"
        fi
    } >&2
    exit 1
}

# ------------------------------------------------------------------ arguments and paths

CMD=${1:-}
[[ -n $CMD ]] || usage
shift
NODES=4
INSTANCE=0
ALL=0
FRESH=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --nodes) NODES=${2:?--nodes needs a value}; shift 2 ;;
        --nodes=*) NODES=${1#*=}; shift ;;
        --instance) INSTANCE=${2:?--instance needs a value}; shift 2 ;;
        --instance=*) INSTANCE=${1#*=}; shift ;;
        --all) ALL=1; shift ;;
        --fresh) FRESH=1; shift ;;
        -h | --help) usage ;;
        *) die "unknown argument '$1' (see: cluster.sh --help)" ;;
    esac
done
if ! [[ $NODES =~ ^([1-9]|1[0-6])$ ]]; then
    die "--nodes must be an integer 1..16, got '$NODES'"
fi
[[ $INSTANCE =~ ^[0-7]$ ]] || die "--instance must be an integer 0..7, got '$INSTANCE'"

instance_paths() {
    local k=$1
    if ((k == 0)); then CONF_DIR=/etc/slurm; else CONF_DIR=/etc/slurm-cluster/i$k; fi
    CONF=$CONF_DIR/slurm.conf
    CLUSTER=cluster$k
    CTLD_PORT=$((17000 + 100 * k))
    RUN_DIR=$SHARED_RUN/i$k
    LOG_DIR=$SHARED_LOG/i$k
    STATE_DIR=/var/lib/slurm-cluster/i$k/state
    SPOOL_DIR=/var/lib/slurm-cluster/i$k/spool
}
instance_paths "$INSTANCE"

need_root() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (it starts munged, MariaDB and Slurm daemons)"
    local b
    for b in munged mariadbd slurmdbd slurmctld slurmd sacctmgr scontrol sinfo; do
        command -v "$b" >/dev/null || [[ -x /usr/sbin/$b ]] ||
            die "$b not found: install the Debian packages first (bash scripts/install-deps.sh)"
    done
}
export PATH="/usr/sbin:/sbin:$PATH"

# Daemons started below get `9>&-`: an inherited lock fd would hold the lock for their lifetime.
lock() {
    mkdir -p "$SHARED_RUN"
    exec 9>"$SHARED_RUN/lock"
    flock -w 180 9 || die "another cluster.sh has held $SHARED_RUN/lock for 180 s"
}

pid_alive() { # pidfile
    [[ -f $1 ]] && kill -0 "$(cat "$1" 2>/dev/null)" 2>/dev/null
}

wait_for() { # seconds command...: poll until the command succeeds
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

# Stop the daemons in the given pid files together (a slurmd takes ~2 s to exit, so one by
# one would make `down` of 16 nodes slow): SIGTERM all, wait up to 10 s, then SIGKILL.
# Like wait_for, but give up at once when the daemon's process has died (no point waiting
# the full timeout for a slurmctld that exited on a bad config or a busy port).
wait_daemon() { # pidfile seconds command...
    local pidfile=$1 deadline=$((SECONDS + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        if [[ -f $pidfile ]] && ! pid_alive "$pidfile"; then
            DAEMON_DIED=1
            return 1
        fi
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}
DAEMON_DIED=0

stop_pidfiles() { # pidfile...
    local f pid pids=()
    for f in "$@"; do
        [[ -f $f ]] || continue
        pid=$(cat "$f" 2>/dev/null || true)
        if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    local deadline=$((SECONDS + 10)) alive
    while ((${#pids[@]})); do
        alive=()
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
        pids=("${alive[@]+"${alive[@]}"}")
        ((${#pids[@]})) || break
        if ((SECONDS >= deadline)); then
            echo "cluster.sh: pids ${pids[*]} ignored SIGTERM for 10 s, killing them" >&2
            kill -KILL "${pids[@]}" 2>/dev/null || true
            break
        fi
        sleep 0.1
    done
    rm -f "$@"
}

render() { # template -> stdout, substituting @KEY@ placeholders
    sed -e "s|@INSTANCE@|$INSTANCE|g" -e "s|@CLUSTER@|$CLUSTER|g" -e "s|@HOST@|$HOST|g" \
        -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@STATE_DIR@|$STATE_DIR|g" \
        -e "s|@RUN_DIR@|$RUN_DIR|g" -e "s|@LOG_DIR@|$LOG_DIR|g" -e "s|@SPOOL_DIR@|$SPOOL_DIR|g" \
        -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@NODES@|$NODES|g" \
        -e "s|@NODE_PORT_FIRST@|$((CTLD_PORT + 1))|g" \
        -e "s|@NODE_PORT_LAST@|$((CTLD_PORT + NODES))|g" \
        -e "s|@SHARED_RUN@|$SHARED_RUN|g" -e "s|@SHARED_LOG@|$SHARED_LOG|g" \
        -e "s|@DB_PASS@|$DB_PASS|g" "$1"
}

# ------------------------------------------------------------------ shared daemons

munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    munge_ok && return 0
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key ||
            die "munge: could not create /etc/munge/munge.key"
    fi
    rm -f /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged 9>&- ||
        fail_daemon munged /var/log/munge/munged.log "did not start"
    wait_for 10 munge_ok || fail_daemon munged /var/log/munge/munged.log "does not answer (munge -n | unmunge)"
}

mariadb_ok() { mariadb-admin --socket="$MYSQL_SOCK" ping; }

start_mariadb() {
    local log=$SHARED_LOG/mariadb.log
    if ! mariadb_ok >/dev/null 2>&1; then
        install -d -o mysql -g mysql -m 0755 /run/mysqld
        if [[ ! -d /var/lib/mysql/mysql ]]; then
            mariadb-install-db --user=mysql --datadir=/var/lib/mysql --skip-test-db >>"$log" 2>&1 ||
                fail_daemon mariadb "$log" "could not initialise /var/lib/mysql"
        fi
        # Loopback only: the test database must not listen on other addresses.
        setsid -f /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1 \
            --socket="$MYSQL_SOCK" --pid-file=/run/mysqld/mysqld.pid \
            </dev/null >>"$log" 2>&1 9>&-
        wait_for 30 mariadb_ok || fail_daemon mariadbd "$log" "does not answer (mariadb-admin ping)"
    fi
    mariadb --socket="$MYSQL_SOCK" -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" >>"$log" 2>&1 ||
        fail_daemon mariadb "$log" "refused to create the slurm database user"
}

dbd_ok() { SLURM_CONF=$CONF timeout 10 sacctmgr -n -P list cluster format=cluster; }

start_slurmdbd() {
    local log=$SHARED_LOG/slurmdbd.log
    mkdir -p "$SHARED_LOG"
    local want
    want=$(render "$TEMPLATES/slurmdbd.conf.tmpl")
    if [[ ! -f $DBD_CONF ]] || [[ $(cat "$DBD_CONF") != "$want" ]]; then
        stop_pidfiles "$SHARED_RUN/slurmdbd.pid"
        install -d /etc/slurm
        (umask 077 && printf '%s\n' "$want" >"$DBD_CONF")
        chmod 600 "$DBD_CONF" # slurmdbd refuses a world-readable conf (it holds a password)
    fi
    if ! pid_alive "$SHARED_RUN/slurmdbd.pid"; then
        env -u SLURM_CONF slurmdbd >>"$log" 2>&1 9>&- || fail_daemon slurmdbd "$log" "did not start"
    fi
    wait_daemon "$SHARED_RUN/slurmdbd.pid" 30 dbd_ok ||
        fail_daemon slurmdbd "$log" "$(died_or "does not answer (sacctmgr list cluster)")"
}

stop_shared_if_unused() {
    local k
    for k in 0 1 2 3 4 5 6 7; do
        pid_alive "$SHARED_RUN/i$k/slurmctld.pid" && return 0
    done
    stop_pidfiles "$SHARED_RUN/slurmdbd.pid"
    if mariadb_ok >/dev/null 2>&1; then
        mariadb-admin --socket="$MYSQL_SOCK" shutdown >/dev/null 2>&1 || true
    fi
    stop_pidfiles /run/munge/munged.pid
    echo "shared daemons (slurmdbd, mariadbd, munged) stopped: no instance is running"
}

# ------------------------------------------------------------------ one instance

CONF_CHANGED=0
write_confs() { # writes the instance's conf files; sets CONF_CHANGED=1 when anything changed
    local name content
    install -d "$CONF_DIR"
    for name in slurm.conf gres.conf cgroup.conf; do
        content=$(render "$TEMPLATES/$name.tmpl")
        if [[ ! -f $CONF_DIR/$name ]] || [[ $(cat "$CONF_DIR/$name") != "$content" ]]; then
            printf '%s\n' "$content" >"$CONF_DIR/$name"
            CONF_CHANGED=1
        fi
    done
    # No restart for a new job_submit.lua: slurmctld reloads it when its mtime changes
    # (a restart would cancel the jobs of whoever is using this instance).
    if ! cmp -s "$REPO/etc/job_submit.lua" "$CONF_DIR/job_submit.lua"; then
        install -m 0644 "$REPO/etc/job_submit.lua" "$CONF_DIR/job_submit.lua.new"
        mv -f "$CONF_DIR/job_submit.lua.new" "$CONF_DIR/job_submit.lua"
    fi
}

ctld_ok() { SLURM_CONF=$CONF timeout 5 scontrol ping | grep -q 'is UP'; }

node_states() { SLURM_CONF=$CONF timeout 5 sinfo -h -N -p batch -o '%N %t'; }

# All N nodes registered and usable (idle/mixed/allocated/completing, no '*' = not responding).
nodes_ok() {
    local states
    states=$(node_states) || return 1
    [[ $(wc -l <<<"$states") -eq $NODES ]] || return 1
    ! grep -qvE ' (idle|mix|alloc|comp)$' <<<"$states"
}

# Wait for nodes_ok; a slurmd that has died (after a 3 s grace for it to daemonize) fails
# at once with its log instead of after the whole timeout.
wait_nodes() { # seconds
    local deadline=$((SECONDS + $1)) grace=$((SECONDS + 3)) i
    until nodes_ok >/dev/null 2>&1; do
        if ((SECONDS >= grace)); then
            for i in $(seq "$NODES"); do
                pid_alive "$RUN_DIR/slurmd-n$i.pid" || fail_daemon "slurmd n$i (instance $INSTANCE)" \
                    "$LOG_DIR/slurmd-n$i.log" "exited during start-up"
            done
        fi
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

slurmds_alive() {
    local i
    for i in $(seq "$NODES"); do
        pid_alive "$RUN_DIR/slurmd-n$i.pid" || return 1
    done
}

instance_up_and_current() {
    pid_alive "$RUN_DIR/slurmctld.pid" && slurmds_alive && ctld_ok >/dev/null 2>&1 &&
        nodes_ok >/dev/null 2>&1
}

stop_instance() {
    if pid_alive "$RUN_DIR/slurmctld.pid" && ctld_ok >/dev/null 2>&1; then
        # Cancel every job (any user) and let the steps end, so that no slurmstepd is left
        # behind without its slurmd.  Bounded: KillWait=5 ends a stubborn step in ~5 s.
        local ids
        ids=$(SLURM_CONF=$CONF timeout 10 squeue -h -o %A 2>/dev/null | tr '\n' ' ' || true)
        if [[ -n ${ids// /} ]]; then
            # shellcheck disable=SC2086 # word splitting of the id list is intended
            SLURM_CONF=$CONF timeout 10 scancel $ids 2>/dev/null || true
            wait_for 15 no_running_jobs || echo "cluster.sh: jobs still ending on $CLUSTER" >&2
        fi
    fi
    stop_pidfiles "$RUN_DIR"/slurmd-*.pid "$RUN_DIR/slurmctld.pid"
}

no_running_jobs() {
    local out
    out=$(SLURM_CONF=$CONF timeout 5 squeue -h -t RUNNING,COMPLETING,CONFIGURING -o %A) &&
        [[ -z $out ]]
}

make_fake_gpus() {
    install -d /dev/fakegpu
    local n
    for n in 0 1 2 3; do
        # Major 195 is the NVIDIA char major; nothing drives it here, the file only has to exist.
        [[ -c /dev/fakegpu/gpu$n ]] || mknod "/dev/fakegpu/gpu$n" c 195 $((200 + n))
    done
}

register_accounting() {
    local out
    if ! SLURM_CONF=$CONF sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
        out=$(SLURM_CONF=$CONF sacctmgr -i add cluster "$CLUSTER" 2>&1) ||
            die "sacctmgr add cluster $CLUSTER failed: $out"
    fi
    if ! SLURM_CONF=$CONF sacctmgr -n -P list assoc cluster="$CLUSTER" user=root \
        format=account | grep -qx default; then
        SLURM_CONF=$CONF sacctmgr -i add account default cluster="$CLUSTER" \
            description=local-test organization=local >/dev/null 2>&1 || true
        out=$(SLURM_CONF=$CONF sacctmgr -i add user root account=default cluster="$CLUSTER" 2>&1) ||
            die "sacctmgr add user root failed: $out"
    fi
}

start_instance() {
    local log i
    install -d "$RUN_DIR" "$LOG_DIR" "$STATE_DIR" "$SPOOL_DIR"
    log=$LOG_DIR/slurmctld.log
    if ! pid_alive "$RUN_DIR/slurmctld.pid"; then
        SLURM_CONF=$CONF slurmctld -f "$CONF" >>"$log" 2>&1 9>&- ||
            fail_daemon "slurmctld (instance $INSTANCE)" "$log" "did not start"
    fi
    wait_daemon "$RUN_DIR/slurmctld.pid" "$WAIT_S" ctld_ok ||
        fail_daemon "slurmctld (instance $INSTANCE)" "$log" \
            "$(died_or "does not answer after ${WAIT_S}s (scontrol ping)")"
    for i in $(seq "$NODES"); do
        pid_alive "$RUN_DIR/slurmd-n$i.pid" && continue
        install -d "$SPOOL_DIR/n$i"
        SLURM_CONF=$CONF slurmd -f "$CONF" -N "n$i" >>"$LOG_DIR/slurmd-n$i.log" 2>&1 9>&- ||
            fail_daemon "slurmd n$i (instance $INSTANCE)" "$LOG_DIR/slurmd-n$i.log" "did not start"
    done
    if ! wait_nodes 8; then
        # Nodes left down/drained by an earlier unclean stop: resume them once, then judge.
        SLURM_CONF=$CONF scontrol update NodeName="n[1-$NODES]" State=RESUME >/dev/null 2>&1 || true
        if ! wait_nodes "$WAIT_S"; then
            local bad
            bad=$(node_states 2>&1 | grep -vE ' (idle|mix|alloc|comp)$' | head -n 1 | cut -d' ' -f1)
            fail_daemon "slurmd ${bad:-?} (instance $INSTANCE)" "$LOG_DIR/slurmd-${bad:-n1}.log" \
                "is not idle after ${WAIT_S}s: $(node_states 2>&1 | tr '\n' ' ')"
        fi
    fi
}

cmd_up() {
    need_root
    lock
    install -d "$SHARED_LOG" "$SHARED_RUN"
    if ((FRESH)); then
        stop_instance
        rm -rf "$STATE_DIR" "$SPOOL_DIR"
    fi
    write_confs
    if ((!CONF_CHANGED)) && munge_ok && instance_up_and_current && dbd_ok >/dev/null 2>&1; then
        echo "instance $INSTANCE already up: $CLUSTER, $NODES nodes, SLURM_CONF=$CONF"
        return 0
    fi
    local t0=$SECONDS
    # A changed slurm.conf/gres.conf/cgroup.conf (other node count) needs a restart.
    if ((CONF_CHANGED)); then stop_instance; fi
    make_fake_gpus
    start_munge
    start_mariadb
    start_slurmdbd
    register_accounting
    start_instance
    echo "instance $INSTANCE up in $((SECONDS - t0))s: $CLUSTER, $NODES nodes, SLURM_CONF=$CONF"
}

cmd_down() {
    need_root
    lock
    local k
    if ((ALL)); then
        for k in 0 1 2 3 4 5 6 7; do
            instance_paths "$k"
            stop_instance
        done
    else
        stop_instance
        echo "instance $INSTANCE down"
    fi
    stop_shared_if_unused
}

show_daemon() { # label pidfile
    if pid_alive "$2"; then
        printf '  %-22s up    pid %s\n' "$1" "$(cat "$2")"
    else
        printf '  %-22s DOWN\n' "$1"
    fi
}

cmd_status() {
    local f rc=0
    echo "shared:"
    if munge_ok; then printf '  %-22s up\n' munged; else printf '  %-22s DOWN\n' munged; rc=1; fi
    if mariadb_ok >/dev/null 2>&1; then printf '  %-22s up\n' mariadbd; else
        printf '  %-22s DOWN\n' mariadbd
        rc=1
    fi
    show_daemon slurmdbd "$SHARED_RUN/slurmdbd.pid" || true
    pid_alive "$SHARED_RUN/slurmdbd.pid" || rc=1
    echo "instance $INSTANCE ($CLUSTER, SLURM_CONF=$CONF):"
    show_daemon slurmctld "$RUN_DIR/slurmctld.pid"
    pid_alive "$RUN_DIR/slurmctld.pid" || rc=1
    for f in "$RUN_DIR"/slurmd-*.pid; do
        [[ -e $f ]] || continue
        local node=${f##*/slurmd-}
        show_daemon "slurmd ${node%.pid}" "$f"
    done
    if ctld_ok >/dev/null 2>&1; then
        SLURM_CONF=$CONF sinfo
    else
        echo "  (slurmctld does not answer: no sinfo)"
        rc=1
    fi
    return $rc
}

case $CMD in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    -h | --help | help) usage ;;
    *) die "unknown command '$CMD' (up | down | status | env)" ;;
esac
