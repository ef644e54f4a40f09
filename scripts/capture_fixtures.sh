#!/usr/bin/env bash
# Capture the parser fixtures of one Slurm version from a real local cluster.
#
#   bash scripts/capture_fixtures.sh --slurm V [--instance K] [--out DIR]
#
# Brings instance K (default 5) of version V up with a fresh state, replays one scenario
# (below) and writes every read the daemon makes, in every JSON generation that version
# offers, to DIR (default tests/fixtures/slurm/V), with CAPTURED.md saying what is where.
# Never run it on an instance somebody else is using: `up --fresh` wipes its state.
#
# Scenario, in order (job ids are whatever the fresh cluster hands out):
#   1. run4: -N4 --comment=elastic, running on n[1-4]; pend4: -N4 (Resources);
#      range24: -N2-4 -t 30 with a comment holding spaces, a fake Key= and a '|';
#      shared24: -p shared -N2-3 --comment='elastic:min=2,max=3' (pending) -> "pending"
#   2. scontrol update JobId=<run4> NumNodes=2: run4 keeps n[1-2], range24 starts on the
#      two freed nodes -> "resized"; then n4 is drained -> "drained"
#   3. everything cancelled, a 1-node job runs to completion -> accounting ("sacct")
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
SLURM="" INSTANCE=5 OUT=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --slurm) SLURM=${2:?}; shift 2 ;;
        --instance) INSTANCE=${2:?}; shift 2 ;;
        --out) OUT=${2:?}; shift 2 ;;
        *) echo "capture_fixtures.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
[[ -n $SLURM ]] || { echo "capture_fixtures.sh: --slurm V is required" >&2; exit 2; }
OUT=${OUT:-$REPO/tests/fixtures/slurm/$SLURM}
mkdir -p "$OUT"
bash "$HERE/cluster.sh" up --slurm "$SLURM" --instance "$INSTANCE" --fresh >/dev/null
eval "$(bash "$HERE/cluster.sh" env --slurm "$SLURM" --instance "$INSTANCE")"
export TZ=UTC # text timestamps are local time: the tests parse them with TZ=UTC
cd /tmp

SQUEUE_FORMAT=$(cd "$REPO" && python3 -c 'from slurm_elastic.slurm.parse_text import SQUEUE_FORMAT as f; print(f)')
SACCT_FIELDS=$(cd "$REPO" && python3 -c 'from slurm_elastic.slurm.parse_text import SACCT_FIELDS as f; print(",".join(f))')
# The JSON generations this version's commands accept, newest last.
GENERATIONS=()
for g in v0.0.38 v0.0.39 v0.0.40 v0.0.41 v0.0.42 v0.0.43 v0.0.44 v0.0.45; do
    squeue --json="$g" >/dev/null 2>&1 && GENERATIONS+=("$g")
done
((${#GENERATIONS[@]})) || GENERATIONS=(default) # 22.05: plain --json only
rows=()

record() { # file command...: run it, keep its stdout, note it
    local file=$1
    shift
    "$@" >"$OUT/$file"
    rows+=("| \`$file\` | \`$*\` | $MOMENT |")
}

json_reads() { # label: every JSON read the daemon makes, in every generation
    local g flag
    for g in "${GENERATIONS[@]}"; do
        flag=--json
        [[ $g == default ]] || flag=--json=$g
        record "squeue-$1.${g#v}.json" squeue "$flag"
        record "sinfo-$1.${g#v}.json" sinfo "$flag"
        if scontrol "$flag" show nodes >/dev/null 2>&1; then
            record "scontrol-nodes-$1.${g#v}.json" scontrol "$flag" show nodes
        fi
    done
    record "squeue-o-$1.txt" squeue -h -a -t all -o "$SQUEUE_FORMAT"
    record "scontrol-o-show-job-$1.txt" scontrol -o show job
}

wait_state() { # job state
    local i
    for i in $(seq 100); do
        [[ $(squeue -h -j "$1" -o %T 2>/dev/null) == "$2" ]] && return 0
        sleep 0.2
    done
    echo "capture_fixtures.sh: job $1 never reached $2" >&2
    exit 1
}

S() { sbatch --parsable -o /dev/null "$@"; }
MOMENT="1: run4 running, pend4/range24/shared24 pending"
RUN4=$(S -N4 -J run4 --comment=elastic --wrap 'sleep 600')
wait_state "$RUN4" RUNNING
PEND4=$(S -N4 -J pend4 --wrap 'sleep 600')
RANGE=$(S -N2-4 -J range24 -t 30 --comment='free text JobState=FAKE | pipe' --wrap 'sleep 600')
SHARED=$(S -N2-3 -p shared -J shared24 --comment='elastic:min=2,max=3' --wrap 'sleep 600')
sleep 3 # let the scheduler look at the pending jobs (a pending job's node count changes then)
json_reads pending
record scontrol-o-show-partition.txt scontrol -o show partition
record scontrol-show-config.txt scontrol show config
record scontrol-version.txt scontrol --version

MOMENT="2: run4 shrunk to 2 nodes, range24 started on the freed nodes"
scancel "$PEND4" "$SHARED"
scontrol update JobId="$RUN4" NumNodes=2
wait_state "$RANGE" RUNNING
json_reads resized
MOMENT="2b: n4 drained"
scontrol update NodeName=n4 State=DRAIN Reason="fixture drain"
json_reads drained
scontrol update NodeName=n4 State=RESUME

MOMENT="3: all cancelled, done1 completed"
scancel "$RUN4" "$RANGE"
DONE=$(S -N1 -J done1 --comment=elastic --wrap 'sleep 1')
for _ in $(seq 100); do
    [[ $(sacct -n -X -j "$DONE" -o state%20 | tr -d ' ') == COMPLETED ]] && break
    sleep 0.3
done
sleep 3 # sacct shows stale data for ~2 s after a short job ends (SLURM-FACTS.md)
for g in "${GENERATIONS[@]}"; do
    flag=--json
    [[ $g == default ]] || flag=--json=$g
    record "sacct.${g#v}.json" sacct -a "$flag" -j "$RUN4,$RANGE,$DONE,$PEND4"
done
record sacct-P.txt sacct -a -X -D -P -n --noconvert -o "$SACCT_FIELDS" -j "$RUN4,$RANGE,$DONE,$PEND4"

{
    echo "# Slurm $(scontrol --version | awk '{print $2}') fixtures (captured from a local test cluster)"
    echo
    echo "Captured $(date -u +%F) by \`bash scripts/capture_fixtures.sh --slurm $SLURM --instance $INSTANCE\`"
    echo "(the scenario is in that script's header) on instance $INSTANCE of \`scripts/cluster.sh\`"
    echo "(4 nodes n1..n4, 4 CPUs and 4 fake GPUs each; partitions \`batch\` (default,"
    echo "OverSubscribe=EXCLUSIVE) and \`shared\`), TZ=UTC.  JSON generations offered:"
    echo "${GENERATIONS[*]} (\`.0.0.NN.json\` is \`--json=v0.0.NN\`)."
    echo "Jobs: run4=$RUN4 pend4=$PEND4 range24=$RANGE shared24=$SHARED done1=$DONE."
    echo
    echo "| file | command | moment |"
    echo "|---|---|---|"
    printf '%s\n' "${rows[@]}"
} >"$OUT/CAPTURED.md"
scancel -u root >/dev/null 2>&1 || true
echo "captured ${#rows[@]} files into $OUT"
