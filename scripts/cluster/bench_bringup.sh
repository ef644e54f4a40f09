#!/usr/bin/env bash
# Bring-up timings of scripts/cluster.sh on this machine (packages already installed):
# cold `up` of one instance (daemons stopped, state wiped), idempotent `up` (no-op check),
# a submitted 1-node job until it has finished, and `down` -- at 4 and 16 nodes.
#
#   bash scripts/cluster/bench_bringup.sh [--instance K]     (default 6: not used by tests)
#
# Shared daemons (munge, MariaDB, slurmdbd) stay up: other instances may be using them.
# Last line: key=value pairs (seconds).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CLUSTER="$HERE/../cluster.sh"
INSTANCE=6
[[ ${1:-} == --instance ]] && INSTANCE=${2:?}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

results=()
for nodes in 4 16; do
    bash "$CLUSTER" down --instance "$INSTANCE" >/dev/null
    t=$(now)
    bash "$CLUSTER" up --instance "$INSTANCE" --nodes "$nodes" --fresh >/dev/null
    cold=$(since "$t")
    t=$(now)
    bash "$CLUSTER" up --instance "$INSTANCE" --nodes "$nodes" >/dev/null
    noop=$(since "$t")
    eval "$(bash "$CLUSTER" env --instance "$INSTANCE")"
    t=$(now)
    job=$(sbatch --parsable -N1 -o /dev/null --wrap true)
    while [[ -n $(squeue -h -j "$job" 2>/dev/null) ]]; do sleep 0.1; done
    smoke=$(since "$t")
    t=$(now)
    bash "$CLUSTER" down --instance "$INSTANCE" >/dev/null
    down=$(since "$t")
    echo "nodes=$nodes cold_up=${cold}s noop_up=${noop}s smoke_job=${smoke}s down=${down}s"
    results+=("up_${nodes}_s=$cold" "noop_up_${nodes}_s=$noop" "job_${nodes}_s=$smoke"
        "down_${nodes}_s=$down")
done
echo "${results[*]}"
