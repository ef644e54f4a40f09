# Pid files and the daemons they name: sourced by cluster.sh (and by tests/test_pidfiles.py,
# which drives these functions on their own).  Plain functions over a path; nothing here
# knows a Slurm version.

# The pid in a pid file is its first line, as Slurm's own read_pidfile (fscanf "%lu") reads
# it: from 24.11 a slurmctld that re-executes itself on `scontrol reconfigure` rewrites its
# pid file in place without truncating it (update_pidfile), so a shorter new pid leaves the
# tail of the old one behind ("395\n4").
pidfile_pid() { # pidfile
    local pid=
    [[ -f $1 ]] && read -r pid <"$1" 2>/dev/null
    printf '%s' "$pid"
}

# A pid file is believed only while its pid runs the daemon the file is named for
# (slurmd-n1.pid: slurmd; slurmctld.pid: slurmctld, or Debian 13's slurmctld-wlm) and that
# process is older than the file.  A machine that stopped without `down` (killed, or a new
# machine booted from a copy of this disk, as CI does) leaves pid files behind whose pids
# the next boot hands to other processes: trusting them skipped starting the daemon (CI:
# "24.11: cluster did not come up", no slurmd started) and would let `down` signal an
# unrelated process.
pid_alive() { # pidfile
    local pid name comm started
    pid=$(pidfile_pid "$1")
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    name=${1##*/}
    name=${name%.pid}
    name=${name%%-*}
    read -r comm 2>/dev/null <"/proc/$pid/comm" || return 1
    [[ $comm == "$name" || $comm == "$name"-* ]] || return 1
    started=$(process_start_epoch "$pid") || return 1
    # Slurm and munged write the file after they fork, so the genuine process is older;
    # 2 s of slack for the clock's ticks and the file time's whole seconds.
    ((started <= $(stat -c %Y "$1") + 2))
}

process_start_epoch() { # pid: when the process started, in seconds since the epoch
    local stat fields btime
    stat=$(<"/proc/$1/stat") || return 1
    # Field 22 (starttime, clock ticks after boot); the fields after the ")" that closes
    # the command name (which may hold spaces) start at field 3.
    read -ra fields <<<"${stat##*) }"
    btime=$(awk '/^btime /{print $2}' /proc/stat) || return 1
    echo $((btime + fields[19] / $(getconf CLK_TCK)))
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
# the full timeout for a slurmctld that exited on a bad config or a busy port).  "Died" is
# a pid the daemon wrote whose process is gone: Slurm's create_pidfile opens the file with
# O_TRUNC before it writes the pid, so an empty file is a daemon mid-write, not a dead one
# (CI, 26.05: "slurmctld exited during start-up" while it came up fine).  Callers remove a
# stale file before they launch (launch_daemon), so any pid here is the new daemon's.
wait_daemon() { # pidfile seconds command...
    local pidfile=$1 deadline=$((SECONDS + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        if pid_gone "$pidfile"; then
            DAEMON_DIED=1
            return 1
        fi
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}
DAEMON_DIED=0

pid_gone() { # pidfile: it holds a whole pid and that process has exited
    local pid
    pid=$(pidfile_pid "$1")
    [[ $pid =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2>/dev/null
}

# A daemon is launched only when its pid file is not believed (pid_alive), so the file, if
# any, is stale: remove it first.  Left in place, wait_daemon would take its dead pid for the
# new daemon dying, and slurmctld's own start-up (_kill_old_slurmctld) would SIGTERM
# whatever process now has that pid.
clear_stale_pidfile() { # pidfile
    pid_alive "$1" || rm -f "$1"
}

stop_pidfiles() { # pidfile...
    local f pid pids=()
    for f in "$@"; do
        [[ -f $f ]] || continue
        pid=$(pidfile_pid "$f")
        if pid_alive "$f"; then
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
