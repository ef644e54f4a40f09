#!/usr/bin/env bash
# A throw-away container with systemd as PID 1, booted from this machine's own file system,
# for testing the shipped unit (systemd/slurm-elastic.service) under a real systemd
# (tests/test_service_under_systemd.py).  As root:
#
#   bash scripts/systemd-container.sh up   --dir DIR [--bind SRC[:DST]] [--bind-ro SRC[:DST]]...
#   bash scripts/systemd-container.sh exec --dir DIR -- CMD...      # CMD inside, as root
#   bash scripts/systemd-container.sh down --dir DIR                # power off, unmount
#
# Why this shape:
#   * The root is an overlay of the host's `/` with a tmpfs upper layer (DIR/rw) mounted on
#     DIR/root: the container sees the host's Debian 12 with its systemd, Slurm clients,
#     munge, Python and users, everything written inside (the package install, /etc, the
#     journal) vanishes at `down`, and the host is never written.  `systemd-nspawn -D /
#     --volatile=overlay` would be the one-liner, but nspawn refuses the host's own root
#     ("Spawning container on root directory is not supported"), so the overlay is mounted
#     here.  An overlay does not show the host's other mounts: pass what the guest needs
#     with --bind (e.g. munged's socket directory, /run/munge).
#   * It boots `basic.target` with `timers.target` masked: journald and the rest of
#     sysinit, and none of the services the host has enabled (MariaDB, munge, slurmctld,
#     slurmd...), which would collide with the host's on the shared network (the container
#     keeps the host's network namespace, so a guest reaches the local clusters on
#     loopback), nor apt's timers.  `systemctl start X` still pulls what X needs.
#   * --register=no --keep-unit: where PID 1 is not systemd (this machine, CI) there is no
#     system bus to register a machine with ("Failed to open system bus").  On a host that
#     does boot with systemd it runs in a transient scope with Delegate=yes, which is what
#     --keep-unit expects.  Without registration machinectl cannot reach it: `exec` enters
#     its namespaces with nsenter, and `down` asks nspawn to power it off (SIGTERM: nspawn
#     sends the guest's systemd SIGRTMIN+3), killing it after 30 s.
set -euo pipefail

say() { echo "systemd-container: $*" >&2; }
die() {
    say "$*"
    exit 1
}
usage() {
    sed -n '6,8p' "${BASH_SOURCE[0]}" | sed 's/^#  *//' >&2
    exit 2
}

BOOT_ARGS=(systemd.unit=basic.target systemd.mask=timers.target)
BOOT_TIMEOUT_S=${SYSTEMD_CONTAINER_BOOT_TIMEOUT_S:-90}
GUEST_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

cmd=${1:-}
[[ -n $cmd ]] || usage
shift
dir=""
binds=()
while (($#)); do
    case $1 in
    --dir)
        dir=$2
        shift 2
        ;;
    --bind | --bind-ro)
        binds+=("$1=$2")
        shift 2
        ;;
    --)
        shift
        break
        ;;
    *) usage ;;
    esac
done
[[ -n $dir ]] || usage
[[ $(id -u) -eq 0 ]] || die "must run as root (mount, systemd-nspawn)"
dir=$(realpath -m "$dir")
# The machine name: the guest's host name, and nspawn's lock; unique per directory.
name="se-test-$(printf '%s' "$dir" | md5sum | cut -c1-8)"

leader() {
    # The guest's PID 1 (host pid): nspawn's only child.
    local pid
    pid=$(cat "$dir/nspawn.pid" 2>/dev/null) || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    ps -o pid= --ppid "$pid" | head -n1 | tr -d ' '
}

inside() {
    local pid
    pid=$(leader) || die "no container running under $dir"
    [[ -n $pid ]] || die "the container under $dir has no PID 1 yet"
    # Mount, UTS, IPC and PID namespaces (the network is the host's anyway); setns into
    # the mount namespace also moves / and the working directory to the guest's root.
    nsenter -t "$pid" -m -u -i -p -- env -i PATH="$GUEST_PATH" HOME=/root LANG=C.UTF-8 "$@"
}

unmount_all() {
    local point
    for point in "$dir/root" "$dir/rw"; do
        if mountpoint -q "$point"; then
            umount "$point" 2>/dev/null || umount -l "$point"
        fi
    done
}

case $cmd in
up)
    command -v systemd-nspawn >/dev/null || die "systemd-nspawn missing (Debian package systemd-container)"
    command -v nsenter >/dev/null || die "nsenter missing (Debian package util-linux)"
    if leader >/dev/null; then
        die "a container is already running under $dir (down first)"
    fi
    mkdir -p "$dir/rw" "$dir/root"
    unmount_all
    mount -t tmpfs -o mode=0755,size=2g slurm-elastic-test "$dir/rw"
    mkdir "$dir/rw/upper" "$dir/rw/work"
    mount -t overlay overlay \
        -o "lowerdir=/,upperdir=$dir/rw/upper,workdir=$dir/rw/work" "$dir/root"
    nspawn=(systemd-nspawn --quiet -D "$dir/root" --machine="$name" --register=no
        --keep-unit --boot --console=passive "${binds[@]}")
    if [[ -d /run/systemd/system ]]; then
        # Booted with systemd: --keep-unit needs a unit of its own with a delegated cgroup.
        nspawn=(systemd-run --quiet --scope --collect --property=Delegate=yes "${nspawn[@]}")
    fi
    # Its own session: a Ctrl-C of the caller does not reach it, `down` ends it.
    setsid "${nspawn[@]}" -- "${BOOT_ARGS[@]}" >"$dir/console.log" 2>&1 </dev/null &
    echo $! >"$dir/nspawn.pid"
    deadline=$((SECONDS + BOOT_TIMEOUT_S))
    state=""
    while ((SECONDS < deadline)); do
        if ! kill -0 "$(cat "$dir/nspawn.pid")" 2>/dev/null; then
            cat "$dir/console.log" >&2
            unmount_all
            die "systemd-nspawn exited during boot (its output above)"
        fi
        if pid=$(leader) && [[ -n $pid ]]; then
            state=$(inside systemctl is-system-running 2>/dev/null || true)
            [[ $state == running || $state == degraded ]] && break
        fi
        sleep 0.5
    done
    if [[ $state != running && $state != degraded ]]; then
        inside systemctl --no-pager --failed >&2 || true
        die "not booted after ${BOOT_TIMEOUT_S}s (system state: ${state:-none})"
    fi
    say "booted $name (state $state, PID 1 is host pid $(leader)) from an overlay of / under $dir"
    ;;
exec)
    (($#)) || usage
    inside "$@"
    ;;
down)
    if pid=$(cat "$dir/nspawn.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null; then
        guest=$(leader || true)
        kill -TERM "$pid"
        for _ in $(seq 60); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.5
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "no clean power-off in 30 s: killing the guest"
            # Killing the guest's PID 1 ends its whole PID namespace; then nspawn exits.
            [[ -n $guest ]] && kill -KILL "$guest" 2>/dev/null
            sleep 1
            kill -KILL "$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/nspawn.pid"
    unmount_all
    # nspawn cannot remove its propagation directory where the host's /run is not a tmpfs.
    rm -rf "/run/systemd/nspawn/propagate/$name"
    say "down: $name"
    ;;
*) usage ;;
esac
