#!/usr/bin/env bash
# Real Slurm clusters on this one machine, from Debian's packages (run as root).
#
#   bash scripts/cluster.sh up     [--slurm V] [--nodes N] [--instance K] [--fresh]
#                                   [--conf KEY=VALUE]...   # extra slurm.conf lines
#                                   [--gpu-types TYPE:N,...] # typed GPUs, a partition per type
#   bash scripts/cluster.sh down   [--slurm V] [--instance K | --all]
#   bash scripts/cluster.sh status [--slurm V] [--instance K]
#   bash scripts/cluster.sh env    [--slurm V] [--instance K]   # prints export lines
#   bash scripts/cluster.sh root   [--slurm V]                  # build V's root only
#   bash scripts/cluster.sh exec   [--slurm V] [--instance K] -- CMD...  # CMD in V's root
#
# V is 22.05 (default: the host's Debian 12 packages), 24.11 (Debian 13) or 26.05 (Debian
# unstable).  The newer versions run from a debootstrapped root under $ROOTS_DIR, built
# once by the first `up` (or `root`) and reused; their daemons run chrooted into it, the
# clients run on the host through the root's own dynamic loader (no privilege needed, so
# `runuser -u alice -- sbatch` works).  Every path the daemons and the clients share is
# written as <root>/path, which resolves inside the root too through a link <root>/<root>
# -> /.  Jobs run inside the root: /dev, /proc, /sys, /tmp, /home, /root and the repository
# are bind-mounted there at the same paths, so the same Python (with torch) and files are
# seen by a job on every version.
#
# Per version: munged (its own socket and key), one slurmdbd (its own port and database
# in the host's MariaDB on 127.0.0.1) and the instances.  Per instance K (0..7): its own
# ClusterName clusterK, slurmctld on port BASE+100K, one `slurmd -N nI` per fake node nI on
# port BASE+100K+I (BASE 17000 / 18000 / 19000 for 22.05 / 24.11 / 26.05), state, spool,
# pid and log paths, and a conf dir.  Host instance 0 writes /etc/slurm/slurm.conf so plain
# `sbatch` works; any other lives in <root>/etc/slurm-cluster/iK (clients need `env`'s
# SLURM_CONF, and PATH for a root's clients).  Every node: 4 CPUs, 4 fake GPUs (gres on
# dummy char devices /dev/fakegpu/gpuN).  Partitions: batch (default, whole nodes) and
# shared.  Opt-in, `--gpu-types a100:2,t4:2` types those GPUs in node order (n1-n2
# gpu:a100:4, n3-n4 gpu:t4:4; the counts add up to --nodes) and adds one partition per
# type, named after it, beside batch and shared; without it the conf files are unchanged.
# Facts: ../shared/SLURM-FACTS.md.
#
# Idempotent: `up` on a running instance with the same config only checks that every
# daemon answers; `down` on a stopped one succeeds; the last instance of a version going
# down stops that version's shared daemons and undoes its root's mounts.  Everything is
# serialised by one lock so several engineers (or pytest sessions) can call it at once.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
TEMPLATES="$HERE/cluster"

# Where the debootstrapped roots of the newer versions live (one directory per version).
ROOTS_DIR=${SLURM_ELASTIC_ROOTS:-/var/lib/slurm-elastic/roots}
VERSIONS=(22.05 24.11 26.05)
# A local, loopback-only test database: the password only keeps slurmdbd off root's socket auth.
DB_PASS=slurm-elastic-local
MYSQL_SOCK=/run/mysqld/mysqld.sock
HOST="$(hostname -s)"
WAIT_S=${CLUSTER_WAIT_S:-40}

usage() {
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
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
# Unprivileged users of the hostile-user tests, given associations when they exist.
TEST_USERS=(se-alice se-bob)
ALL=0
FRESH=0
# Extra slurm.conf lines of this `up` (a site's setting a test needs, e.g.
# DataParserParameters=v0.0.40): an instance runs with exactly the ones of its last `up`.
EXTRA_CONF=()
# --gpu-types TYPE:COUNT,...: typed fake GPUs for a heterogeneous-GPU cluster ("" = untyped).
GPU_TYPES=""
SLURM=${SLURM_ELASTIC_SLURM:-22.05}
SLURM_GIVEN=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --nodes) NODES=${2:?--nodes needs a value}; shift 2 ;;
        --nodes=*) NODES=${1#*=}; shift ;;
        --instance) INSTANCE=${2:?--instance needs a value}; shift 2 ;;
        --instance=*) INSTANCE=${1#*=}; shift ;;
        --slurm) SLURM=${2:?--slurm needs a value}; SLURM_GIVEN=1; shift 2 ;;
        --slurm=*) SLURM=${1#*=}; SLURM_GIVEN=1; shift ;;
        --all) ALL=1; shift ;;
        --fresh) FRESH=1; shift ;;
        --conf) EXTRA_CONF+=("${2:?--conf needs KEY=VALUE}"); shift 2 ;;
        --conf=*) EXTRA_CONF+=("${1#*=}"); shift ;;
        --gpu-types) GPU_TYPES=${2:?--gpu-types needs TYPE:COUNT[,TYPE:COUNT]...}; shift 2 ;;
        --gpu-types=*) GPU_TYPES=${1#*=}; shift ;;
        --) shift; break ;;
        -h | --help) usage ;;
        *) die "unknown argument '$1' (see: cluster.sh --help)" ;;
    esac
done
if ! [[ $NODES =~ ^([1-9]|1[0-6])$ ]]; then
    die "--nodes must be an integer 1..16, got '$NODES'"
fi
[[ $INSTANCE =~ ^[0-7]$ ]] || die "--instance must be an integer 0..7, got '$INSTANCE'"
# A value may hold spaces (a PartitionName= line), never a quote, '$', '#' or a newline.
conf_line='^[A-Za-z]+=[][A-Za-z0-9._,+/:= -]+$'
for line in "${EXTRA_CONF[@]}"; do
    [[ $line =~ $conf_line ]] ||
        die "--conf must be KEY=VALUE (a word; letters, digits, spaces, ._,+/:=[]-), got '$line'"
done
# --gpu-types as "TYPE FIRST LAST" node groups, in node order.  A type names a partition
# too, so not batch or shared, and each type once.
GPU_GROUPS=()
if [[ -n $GPU_TYPES ]]; then
    gpu_item='[a-z][a-z0-9_]{0,15}:[1-9][0-9]?'
    gpu_error="--gpu-types must be TYPE:COUNT[,TYPE:COUNT]... (TYPE: a-z, 0-9, _, a letter first, each once, not batch or shared; the COUNTs adding up to --nodes $NODES), got '$GPU_TYPES'"
    [[ $GPU_TYPES =~ ^$gpu_item(,$gpu_item)*$ ]] || die "$gpu_error"
    first=1
    IFS=, read -ra gpu_items <<<"$GPU_TYPES"
    for item in "${gpu_items[@]}"; do
        type=${item%%:*}
        case " batch shared ${GPU_GROUPS[*]/%/ } " in *" $type "*) die "$gpu_error" ;; esac
        GPU_GROUPS+=("$type $first $((first + ${item#*:} - 1))")
        first=$((first + ${item#*:}))
    done
    ((first - 1 == NODES)) || die "$gpu_error"
fi

# ------------------------------------------------------------------ versions
#
# Everything that differs between versions is set here, nowhere else:
#   ROOT      the debootstrapped root ("" = the host's own packages)
#   P         prefix of every path the daemons (in the root) and clients (on the host) share
#   BIN_DIR   the host-side wrappers that run the root's clients ("" = the host's PATH)
#   SUITE     the Debian suite the root is built from, with the packages it gets
#   BASE      first port of instance 0; DBD_PORT, DB_NAME: its slurmdbd and database
version_settings() {
    case $1 in
        22.05)
            ROOT="" SUITE="" BASE=17000 DBD_PORT=6819 DB_NAME=slurm_acct_db
            CGROUP_PLUGIN=cgroup/v1 ;; # 22.05 has no "disabled" (slurmd fails to start)
        24.11)
            ROOT=$ROOTS_DIR/24.11 SUITE=trixie BASE=18000 DBD_PORT=6829 DB_NAME=slurm_acct_db_2411
            CGROUP_PLUGIN=disabled ;;
        26.05)
            ROOT=$ROOTS_DIR/26.05 SUITE=sid BASE=19000 DBD_PORT=6839 DB_NAME=slurm_acct_db_2605
            CGROUP_PLUGIN=disabled ;;
        *) die "--slurm must be one of ${VERSIONS[*]}, got '$1'" ;;
    esac
    P=$ROOT
    if [[ -n $ROOT ]]; then
        BIN_DIR=$ROOT.bin
        PLUGIN_DIR=$ROOT/usr/lib/x86_64-linux-gnu/slurm-wlm
        MUNGE_SOCKET=$ROOT/run/munge/munge.socket.2
        # The root's munged has its own socket; tell every Slurm component where it is.
        AUTH_INFO="cred_expire=10,socket=$MUNGE_SOCKET"
        STORAGE_HOST=127.0.0.1 # the host's MariaDB over TCP: the root has no server
    else
        BIN_DIR="" PLUGIN_DIR="" MUNGE_SOCKET=/run/munge/munge.socket.2
        AUTH_INFO=cred_expire=10
        STORAGE_HOST=localhost
    fi
    SHARED_RUN=$P/run/slurm-cluster
    SHARED_LOG=$P/var/log/slurm-cluster
    DBD_CONF=$P/etc/slurm/slurmdbd.conf
}

instance_paths() {
    local k=$1
    if ((k == 0)) && [[ -z $ROOT ]]; then CONF_DIR=/etc/slurm; else CONF_DIR=$P/etc/slurm-cluster/i$k; fi
    CONF=$CONF_DIR/slurm.conf
    CLUSTER=cluster$k
    CTLD_PORT=$((BASE + 100 * k))
    RUN_DIR=$SHARED_RUN/i$k
    LOG_DIR=$SHARED_LOG/i$k
    STATE_DIR=$P/var/lib/slurm-cluster/i$k/state
    SPOOL_DIR=$P/var/lib/slurm-cluster/i$k/spool
}
version_settings "$SLURM"
instance_paths "$INSTANCE"

need_root() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (it starts munged, MariaDB and Slurm daemons)"
    local b
    # The host always runs MariaDB and munge's clients; Slurm itself from the host or a root.
    for b in munge mariadbd sacctmgr; do
        command -v "$b" >/dev/null || [[ -x /usr/sbin/$b ]] ||
            die "$b not found: install the Debian packages first (bash scripts/install-deps.sh)"
    done
    if [[ -n $ROOT ]]; then
        command -v debootstrap >/dev/null || [[ -x /usr/sbin/debootstrap ]] ||
            die "debootstrap not found: install the Debian packages first (bash scripts/install-deps.sh)"
    fi
}
ORIG_PATH=$PATH # what `env` hands on: the caller's PATH, not this script's additions
without_root_bins() { # PATH: without any version's client wrappers (a shell that ran `env`)
    local path=":$1:" v
    for v in "${VERSIONS[@]}"; do path=${path//:$ROOTS_DIR\/$v.bin:/:}; done
    path=${path#:}
    printf '%s' "${path%:}"
}
export PATH="/usr/sbin:/sbin:$(without_root_bins "$PATH")"
# A root's clients first: cluster.sh's own sacctmgr/scontrol/sinfo must be that version's
# (and 22.05's the host's, even when the caller's PATH has another root's wrappers).
if [[ -n $BIN_DIR ]]; then export PATH="$BIN_DIR:$PATH"; fi

# A daemon of this version: from the host, or chrooted into the version's root.
in_root() {
    if [[ -n $ROOT ]]; then chroot "$ROOT" "$@"; else "$@"; fi
}

# Daemons started below get `9>&-`: an inherited lock fd would hold the lock for their lifetime.
# One lock for every version: they share MariaDB, and a root is built once.
LOCK_FILE=/run/slurm-cluster/lock
lock() {
    mkdir -p "$(dirname "$LOCK_FILE")"
    exec 9>"$LOCK_FILE"
    flock -w 600 9 || die "another cluster.sh has held $LOCK_FILE for 600 s"
}

# pidfile_pid, pid_alive, pid_gone, wait_for, wait_daemon, clear_stale_pidfile, stop_pidfiles
# shellcheck source=scripts/cluster/pidfiles.sh
source "$TEMPLATES/pidfiles.sh"

render() { # template -> stdout, substituting @KEY@ placeholders; "@ROOT@ " lines: roots only
    local ROOT_ONLY='/^@ROOT@ /d'
    [[ -n $ROOT ]] && ROOT_ONLY='s/^@ROOT@ //'

    sed -e "s|@INSTANCE@|$INSTANCE|g" -e "s|@CLUSTER@|$CLUSTER|g" -e "s|@HOST@|$HOST|g" \
        -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@STATE_DIR@|$STATE_DIR|g" \
        -e "s|@RUN_DIR@|$RUN_DIR|g" -e "s|@LOG_DIR@|$LOG_DIR|g" -e "s|@SPOOL_DIR@|$SPOOL_DIR|g" \
        -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@NODES@|$NODES|g" \
        -e "s|@NODE_PORT_FIRST@|$((CTLD_PORT + 1))|g" \
        -e "s|@NODE_PORT_LAST@|$((CTLD_PORT + NODES))|g" \
        -e "s|@SHARED_RUN@|$SHARED_RUN|g" -e "s|@SHARED_LOG@|$SHARED_LOG|g" \
        -e "s|@DB_PASS@|$DB_PASS|g" -e "s|@DB_NAME@|$DB_NAME|g" \
        -e "s|@AUTH_INFO@|$AUTH_INFO|g" -e "s|@STORAGE_HOST@|$STORAGE_HOST|g" \
        -e "s|@CGROUP_PLUGIN@|$CGROUP_PLUGIN|g" -e "s|@MUNGE_SOCKET@|$MUNGE_SOCKET|g" \
        -e "s|@PLUGIN_DIR@|$PLUGIN_DIR|g" -e "s|@CONF_DIR@|$CONF_DIR|g" -e "$ROOT_ONLY" "$1"
}

# ------------------------------------------------------------------ a version's root

# What a root gets besides its minbase: Slurm, munge, what the host's Python needs at run
# time there (libffi for ctypes, which torch imports; ps/pkill for job scripts), and for
# 24.11 what builds pyslurm against its libslurm (scripts/build-pyslurm.sh).
root_packages() {
    local packages=(slurmctld slurmd slurm-client slurmdbd munge libffi8 procps)
    # libslurm-dev: the headers the --elastic plugin is built against (build_spank; the
    # host's gcc compiles it); gcc and libc6-dev: pyslurm's build runs inside the 24.11 root.
    packages+=(libslurm-dev)
    # python3: the system's interpreter, as on any Debian compute host; the hostile-user
    # tests' jobs run the job side's access layer with it as an unprivileged user, who cannot
    # read root's interpreter (tests/test_hostile_jobdir_live.py).
    packages+=(python3)
    [[ $SLURM == 24.11 ]] && packages+=(gcc libc6-dev)
    echo "${packages[*]}"
}

# Host directories a job inside the root sees at the same path (the repository and the
# Python with torch live under one of them or are added by share_path).
ROOT_BINDS=(/dev /proc /sys /tmp /home /root)

# Build the root once: debootstrap from Debian's archive (its default mirror), then the
# packages.  A stamp holds what was installed, so a later `up` costs one file read.
ensure_root() {
    [[ -n $ROOT ]] || return 0
    local want stamp=$ROOT/.slurm-elastic-root log=$ROOTS_DIR/$SLURM.build.log
    want="$SUITE $(root_packages)"
    [[ -f $stamp && $(cat "$stamp") == "$want" ]] && return 0
    install -d "$ROOTS_DIR"
    echo "building the Slurm $SLURM root ($SUITE) in $ROOT (once; log: $log)"
    if [[ ! -x $ROOT/usr/bin/apt-get ]]; then
        # Never rm -rf a root: it may have /root, /tmp, /home bind-mounted into it.  The
        # scratch directory is never mounted into.
        [[ ! -e $ROOT ]] || die "$ROOT exists but is not a usable root: move it away first"
        rm -rf "$ROOT.building"
        debootstrap --variant=minbase "$SUITE" "$ROOT.building" >"$log" 2>&1 ||
            die "debootstrap $SUITE failed (see $log)"
        mv "$ROOT.building" "$ROOT"
    fi
    # No daemon may start from a package script; apt inside needs the host's resolver.
    printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
    chmod 755 "$ROOT/usr/sbin/policy-rc.d"
    cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
    # sid's Release file counts as expired on this machine's clock (SLURM-FACTS.md).
    local apt=(apt-get -q -o Acquire::Check-Valid-Until=false)
    # shellcheck disable=SC2046 # the package list is meant to split
    { chroot "$ROOT" "${apt[@]}" update &&
        DEBIAN_FRONTEND=noninteractive chroot "$ROOT" "${apt[@]}" install -y \
            --no-install-recommends $(root_packages); } >>"$log" 2>&1 ||
        die "installing Slurm $SLURM into $ROOT failed (see $log)"
    # The link that makes every <root>/path also valid inside the root.
    install -d "$ROOT$(dirname "$ROOT")"
    ln -sfn / "$ROOT$ROOT"
    printf '%s\n' "$want" >"$stamp"
    echo "Slurm $SLURM root ready: $(chroot "$ROOT" dpkg-query -W -f='${Version}' slurmctld)"
}

# One host-side script per client: the root's binary through the root's dynamic loader and
# libraries, so any user runs it on the host without chroot (and with the caller's cwd).
write_client_wrappers() {
    local libs=$ROOT/usr/lib/x86_64-linux-gnu
    local loader=$libs/ld-linux-x86-64.so.2 b
    [[ -x $loader ]] || die "no dynamic loader at $loader"
    install -d "$BIN_DIR"
    for b in sacct sacctmgr salloc sattach sbatch sbcast scancel scontrol scrontab sdiag sinfo \
        sprio squeue sreport srun sshare sstat strigger; do
        [[ -x $ROOT/usr/bin/$b ]] || continue
        cat >"$BIN_DIR/$b" <<WRAPPER
#!/bin/sh
# Generated by scripts/cluster.sh: Slurm $SLURM's $b from $ROOT, run on the host.
exec "$loader" --library-path "$libs:$PLUGIN_DIR" --argv0 $b "$ROOT/usr/bin/$b" "\$@"
WRAPPER
        chmod 755 "$BIN_DIR/$b"
    done
    # MUNGE credentials for this cluster come from the root's munged (slurm-elastic's API
    # authenticates job reports with munge/unmunge): the host's tools on the root's socket.
    for b in munge unmunge; do
        cat >"$BIN_DIR/$b" <<WRAPPER
#!/bin/sh
# Generated by scripts/cluster.sh: $b against the munged of Slurm $SLURM's root.
exec /usr/bin/$b --socket="$MUNGE_SOCKET" "\$@"
WRAPPER
        chmod 755 "$BIN_DIR/$b"
    done
}

# The root sees the host's users (jobs run as them; munged runs as the host's munge user)
# and host name; synced on every `up` so users added since are there.
sync_root_files() {
    local f
    for f in passwd group shadow gshadow hosts; do
        [[ -f /etc/$f ]] && cp -p "/etc/$f" "$ROOT/etc/$f"
    done
}

share_path() { # dir: bind-mount it at the same path in the root, unless already seen there
    local dir=$1 b
    for b in "${ROOT_BINDS[@]}"; do
        [[ $dir == "$b" || $dir == "$b"/* ]] && return 0
    done
    case $dir in /usr | /usr/* | /etc | /etc/* | /var | /bin | /lib | /sbin | /)
        echo "cluster.sh: warning: $dir is not shared with jobs in the Slurm $SLURM root" >&2
        return 0 ;;
    esac
    mount_bind "$dir"
}

mount_bind() { # dir
    local dir=$1
    mountpoint -q "$ROOT$dir" && return 0
    [[ -d $dir ]] || return 0
    install -d "$ROOT$dir"
    # rslave: unmounting inside the root later never propagates back to the host.
    mount --rbind "$dir" "$ROOT$dir" && mount --make-rslave "$ROOT$dir" ||
        die "cannot bind-mount $dir into $ROOT"
}

mount_root() {
    [[ -n $ROOT ]] || return 0
    local d
    for d in "${ROOT_BINDS[@]}"; do mount_bind "$d"; done
    share_path "$REPO"
}

unmount_root() {
    [[ -n $ROOT ]] || return 0
    local target
    # Deepest first; a busy one (a process left in the root) is detached lazily.
    while read -r target; do
        umount "$target" 2>/dev/null || umount -l "$target" 2>/dev/null || true
    done < <(findmnt -rn -o TARGET | grep -F "$ROOT/" | sort -r)
}

# ------------------------------------------------------------------ shared daemons

munge_ok() {
    munge -S "$MUNGE_SOCKET" -n </dev/null 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1
}

as_munge() { # command...: as the munge user, in this version's root
    if [[ -n $ROOT ]]; then chroot --userspec=munge:munge "$ROOT" "$@"; else runuser -u munge -- "$@"; fi
}

start_munge() {
    munge_ok && return 0
    local log=$P/var/log/munge/munged.log
    install -d -o munge -g munge -m 0755 "$P/run/munge"
    install -d -o munge -g munge -m 0700 "$P/var/log/munge" "$P/var/lib/munge" "$P/etc/munge"
    # A root's package made its key for the root's own munge uid: give it to ours.
    [[ -f $P/etc/munge/munge.key ]] && chown munge:munge "$P/etc/munge/munge.key"
    if [[ ! -s $P/etc/munge/munge.key ]]; then
        as_munge mungekey --create --keyfile=/etc/munge/munge.key ||
            die "munge: could not create $P/etc/munge/munge.key"
    fi
    rm -f "$P/run/munge/munged.pid"
    as_munge /usr/sbin/munged 9>&- || fail_daemon "munged (Slurm $SLURM)" "$log" "did not start"
    wait_for 10 munge_ok ||
        fail_daemon "munged (Slurm $SLURM)" "$log" "does not answer (munge -n | unmunge)"
}

mariadb_ok() { mariadb-admin --socket="$MYSQL_SOCK" ping; }

# One MariaDB on the host for every version (each version's slurmdbd has its own database):
# Debian 13's MariaDB 11.8 makes slurmdbd 24.11 exit at start (SLURM-FACTS.md).
start_mariadb() {
    local log=/var/log/slurm-cluster/mariadb.log
    install -d /var/log/slurm-cluster
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
    # A root's slurmdbd connects over TCP to 127.0.0.1 (its own socket path does not exist).
    mariadb --socket="$MYSQL_SOCK" -e "
        CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
        GRANT ALL ON $DB_NAME.* TO 'slurm'@'localhost';
        GRANT ALL ON $DB_NAME.* TO 'slurm'@'127.0.0.1';" >>"$log" 2>&1 ||
        fail_daemon mariadb "$log" "refused to create the slurm database user"
}

dbd_ok() { SLURM_CONF=$CONF timeout 10 sacctmgr -n -P list cluster format=cluster; }

start_slurmdbd() {
    local log=$SHARED_LOG/slurmdbd.log
    mkdir -p "$SHARED_LOG" "$SHARED_RUN"
    local want
    want=$(render "$TEMPLATES/slurmdbd.conf.tmpl")
    if [[ ! -f $DBD_CONF ]] || [[ $(cat "$DBD_CONF") != "$want" ]]; then
        stop_pidfiles "$SHARED_RUN/slurmdbd.pid"
        install -d "$(dirname "$DBD_CONF")"
        (umask 077 && printf '%s\n' "$want" >"$DBD_CONF")
        chmod 600 "$DBD_CONF" # slurmdbd refuses a world-readable conf (it holds a password)
    fi
    if ! pid_alive "$SHARED_RUN/slurmdbd.pid"; then
        clear_stale_pidfile "$SHARED_RUN/slurmdbd.pid"
        # slurmdbd reads slurmdbd.conf beside $SLURM_CONF (default /etc/slurm, which in a
        # root is $DBD_CONF's directory).
        SLURM_CONF=$(dirname "$DBD_CONF")/slurm.conf in_root slurmdbd >>"$log" 2>&1 9>&- ||
            fail_daemon "slurmdbd (Slurm $SLURM)" "$log" "did not start"
    fi
    wait_daemon "$SHARED_RUN/slurmdbd.pid" 30 dbd_ok ||
        fail_daemon "slurmdbd (Slurm $SLURM)" "$log" "$(died_or "does not answer (sacctmgr list cluster)")"
}

any_instance_up() { # version: 0 when one of its instances' slurmctld runs
    local k v=$1 saved=$SLURM
    version_settings "$v"
    for k in 0 1 2 3 4 5 6 7; do
        if pid_alive "$SHARED_RUN/i$k/slurmctld.pid"; then
            version_settings "$saved"
            return 0
        fi
    done
    version_settings "$saved"
    return 1
}

# The last instance of a version gone: stop its slurmdbd and munged, undo its root's
# mounts; the last of all versions: stop MariaDB too.
stop_shared_if_unused() {
    any_instance_up "$SLURM" && return 0
    stop_pidfiles "$SHARED_RUN/slurmdbd.pid" "$P/run/munge/munged.pid"
    unmount_root
    echo "Slurm $SLURM: shared daemons (slurmdbd, munged) stopped: no instance is running"
    local v
    for v in "${VERSIONS[@]}"; do
        any_instance_up "$v" && return 0
    done
    if mariadb_ok >/dev/null 2>&1; then
        mariadb-admin --socket="$MYSQL_SOCK" shutdown >/dev/null 2>&1 || true
        echo "mariadbd stopped: no instance of any version is running"
    fi
}

# ------------------------------------------------------------------ one instance

CONF_CHANGED=0
# The --elastic option: etc/spank/elastic.c built once per version against its own headers
# (a SPANK plugin loads only into the Slurm release it was built for), at a path that is the
# same for the root's daemons and for its clients run from the host.
spank_plugin() { echo "$P/usr/lib/slurm-elastic/spank/elastic.so"; }
build_spank() {
    local so out
    so=$(spank_plugin)
    cmp -s "$REPO/etc/spank/elastic.c" "$so.c" && [[ -f $so ]] && return 0
    out=$(bash "$HERE/build-spank.sh" --include "$P/usr/include" --out "$so" 2>&1) ||
        die "the --elastic plugin did not build: $out"
    install -m 0644 "$REPO/etc/spank/elastic.c" "$so.c"
}

# The rendered slurm.conf or gres.conf ($1, content $2) with --gpu-types applied: the one
# NodeName line of all nodes becomes one line per type (its nodes, their ports, Gres=gpu:TYPE:4
# in slurm.conf, Type=TYPE in gres.conf), and slurm.conf gets one partition per type, like
# batch (whole nodes).  Only called with --gpu-types: the default files stay as rendered.
typed_gpu_conf() {
    local name=$1 line group type first last nodes ports typed out=()
    while IFS= read -r line; do
        if [[ $line != "NodeName=n[1-$NODES] "* ]]; then
            out+=("$line")
            continue
        fi
        for group in "${GPU_GROUPS[@]}"; do
            read -r type first last <<<"$group"
            nodes="n[$first-$last]" ports="[$((CTLD_PORT + first))-$((CTLD_PORT + last))]"
            if ((first == last)); then nodes="n$first" ports=$((CTLD_PORT + first)); fi
            typed=${line/#"NodeName=n[1-$NODES] "/"NodeName=$nodes "}
            if [[ $name == slurm.conf ]]; then
                typed=${typed/" Port=[$((CTLD_PORT + 1))-$((CTLD_PORT + NODES))] "/" Port=$ports "}
                typed=${typed/" Gres=gpu:4 "/" Gres=gpu:$type:4 "}
            else
                typed=${typed/" Name=gpu "/" Name=gpu Type=$type "}
            fi
            out+=("$typed")
        done
    done <<<"$2"
    if [[ $name == slurm.conf ]]; then
        out+=("# cluster.sh up --gpu-types $GPU_TYPES: one partition per GPU type.")
        for group in "${GPU_GROUPS[@]}"; do
            read -r type first last <<<"$group"
            nodes="n[$first-$last]"
            ((first != last)) || nodes="n$first"
            out+=("PartitionName=$type Nodes=$nodes Default=NO OverSubscribe=EXCLUSIVE MaxTime=INFINITE State=UP")
        done
    fi
    printf '%s\n' "${out[@]}"
}

write_confs() { # writes the instance's conf files; sets CONF_CHANGED=1 when anything changed
    local name content
    install -d "$CONF_DIR"
    build_spank
    content=$(printf '# slurm-elastic: the --elastic option (scripts/build-spank.sh)\noptional %s' \
        "$(spank_plugin)")
    if [[ ! -f $CONF_DIR/plugstack.conf ]] || [[ $(cat "$CONF_DIR/plugstack.conf") != "$content" ]]; then
        printf '%s\n' "$content" >"$CONF_DIR/plugstack.conf"
        CONF_CHANGED=1
    fi
    for name in slurm.conf gres.conf cgroup.conf; do
        content=$(render "$TEMPLATES/$name.tmpl")
        if [[ $name != cgroup.conf ]] && ((${#GPU_GROUPS[@]})); then
            content=$(typed_gpu_conf "$name" "$content")
        fi
        if [[ $name == slurm.conf ]] && ((${#EXTRA_CONF[@]})); then
            content+=$'\n# cluster.sh up --conf:'
            content+=$(printf '\n%s' "${EXTRA_CONF[@]}")
        fi
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

# Wait for nodes_ok; a slurmd that has died (after a 5 s grace for it to daemonize) fails
# at once with its log instead of after the whole timeout.
wait_nodes() { # seconds
    local deadline=$((SECONDS + $1)) grace=$((SECONDS + 5)) i
    until nodes_ok >/dev/null 2>&1; do
        if ((SECONDS >= grace)); then
            for i in $(seq "$NODES"); do
                # Past the grace, no file is a slurmd that died before writing one (a busy
                # port); an empty one is still being written.
                { [[ ! -e $RUN_DIR/slurmd-n$i.pid ]] || pid_gone "$RUN_DIR/slurmd-n$i.pid"; } &&
                    fail_daemon "slurmd n$i (instance $INSTANCE)" \
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
    # The unprivileged test users (scripts/install-deps.sh adds them on the host; every
    # `up` copies the host's passwd into a root): 26.05 refuses a user without one.
    local user users
    users=$(SLURM_CONF=$CONF sacctmgr -n -P list assoc cluster="$CLUSTER" format=user)
    for user in "${TEST_USERS[@]}"; do
        id -u "$user" >/dev/null 2>&1 || continue
        grep -qx "$user" <<<"$users" && continue
        out=$(SLURM_CONF=$CONF sacctmgr -i add user "$user" account=default cluster="$CLUSTER" 2>&1) ||
            die "sacctmgr add user $user failed: $out"
    done
}

start_instance() {
    local log i
    install -d "$RUN_DIR" "$LOG_DIR" "$STATE_DIR" "$SPOOL_DIR"
    log=$LOG_DIR/slurmctld.log
    if ! pid_alive "$RUN_DIR/slurmctld.pid"; then
        clear_stale_pidfile "$RUN_DIR/slurmctld.pid"
        SLURM_CONF=$CONF in_root slurmctld -f "$CONF" >>"$log" 2>&1 9>&- ||
            fail_daemon "slurmctld (instance $INSTANCE)" "$log" "did not start"
    fi
    wait_daemon "$RUN_DIR/slurmctld.pid" "$WAIT_S" ctld_ok ||
        fail_daemon "slurmctld (instance $INSTANCE)" "$log" \
            "$(died_or "does not answer after ${WAIT_S}s (scontrol ping)")"
    for i in $(seq "$NODES"); do
        pid_alive "$RUN_DIR/slurmd-n$i.pid" && continue
        clear_stale_pidfile "$RUN_DIR/slurmd-n$i.pid"
        install -d "$SPOOL_DIR/n$i"
        SLURM_CONF=$CONF in_root slurmd -f "$CONF" -N "n$i" >>"$LOG_DIR/slurmd-n$i.log" 2>&1 9>&- ||
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
    ensure_root
    install -d "$SHARED_LOG" "$SHARED_RUN"
    if [[ -n $ROOT ]]; then
        sync_root_files
        write_client_wrappers
        mount_root
    fi
    if ((FRESH)); then
        stop_instance
        rm -rf "$STATE_DIR" "$SPOOL_DIR"
    fi
    write_confs
    if ((!CONF_CHANGED)) && munge_ok && instance_up_and_current && dbd_ok >/dev/null 2>&1; then
        echo "instance $INSTANCE already up: Slurm $SLURM, $CLUSTER, $NODES nodes, SLURM_CONF=$CONF"
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
    echo "instance $INSTANCE up in $((SECONDS - t0))s: Slurm $SLURM, $CLUSTER, $NODES nodes, SLURM_CONF=$CONF"
}

# `down --all`: every instance of every version (or of --slurm V only, when given).
cmd_down() {
    need_root
    lock
    local k v versions=("$SLURM")
    if ((ALL)); then
        ((SLURM_GIVEN)) || versions=("${VERSIONS[@]}")
        for v in "${versions[@]}"; do
            version_settings "$v"
            SLURM=$v
            for k in 0 1 2 3 4 5 6 7; do
                instance_paths "$k"
                stop_instance
            done
            stop_shared_if_unused
        done
    else
        stop_instance
        echo "instance $INSTANCE (Slurm $SLURM) down"
        stop_shared_if_unused
    fi
}

# The exports after which the clients and slurm-elastic talk to this instance.  PATH gets
# this version's client wrappers first and loses any other root's (so switching versions
# in one shell works); the values are expanded here, so a program may parse the lines.
cmd_env() {
    local path
    path=$(without_root_bins "$ORIG_PATH")
    [[ -n $BIN_DIR ]] && path=$BIN_DIR:$path
    printf 'export SLURM_CONF=%q\n' "$CONF"
    printf 'export PATH=%q\n' "$path"
    printf 'export SLURM_ELASTIC_SLURM=%q\n' "$SLURM"
}

show_daemon() { # label pidfile
    if pid_alive "$2"; then
        printf '  %-22s up    pid %s\n' "$1" "$(pidfile_pid "$2")"
    else
        printf '  %-22s DOWN\n' "$1"
    fi
}

cmd_status() {
    local f rc=0
    echo "Slurm $SLURM${ROOT:+ (root $ROOT)}, shared:"
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

# A command inside this version's root (its cluster up, so the root is mounted), in the
# caller's directory and environment, with the instance's SLURM_CONF: for what must load
# that version's libraries in-process (pyslurm built against the root's libslurm).  On
# 22.05 the command simply runs on the host.
cmd_exec() {
    (($#)) || die "exec needs a command: cluster.sh exec --slurm V [--instance K] -- CMD..."
    local vars=(SLURM_CONF="$CONF" SLURM_ELASTIC_SLURM="$SLURM" SLURM_ELASTIC_TEST_INSTANCE="$INSTANCE")
    [[ -n $ROOT ]] || exec env "${vars[@]}" "$@"
    need_root
    mountpoint -q "$ROOT/tmp" || die "the Slurm $SLURM root is not mounted: bring an instance up first"
    exec chroot "$ROOT" /usr/bin/env -C "$PWD" "${vars[@]}" SLURM_ELASTIC_IN_ROOT="$SLURM" "$@"
}

case $CMD in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) cmd_env ;;
    exec) cmd_exec "$@" ;;
    root)
        need_root
        lock
        ensure_root
        echo "Slurm $SLURM: ${ROOT:-from the host packages}"
        ;;
    -h | --help | help) usage ;;
    *) die "unknown command '$CMD' (up | down | status | env | root | exec)" ;;
esac
