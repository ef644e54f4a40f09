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
#   3. run4 and range24 cancelled; het1: a heterogeneous job (-N1 + -N1, -p shared)
#      running; requeue1 (-N1 -p shared) running, then `scontrol requeue` -> pending
#      again with one restart; held23: -N2-3 --hold (JobHeldUser); dep1: -N1 afterok on
#      het1 (Dependency); nl1: held, a comment and a --wrap script with a newline (Slurm
#      prints both raw, 26.05 the script in SubmitLine) -> "het" (jobs and nodes, in the
#      default JSON generation only; `scontrol --json show job` of het1 where it exists)
#   4. everything cancelled, a 1-node job runs to completion -> accounting ("sacct")
# Every moment also records `squeue -O` (parse_text.squeue_format, every field followed by
# parse_text.CAPTURE_SEPARATOR, as the backend's fresh separator would be) and `scontrol -o show
# job`, so that the tests can hold the text paths against the JSON of the same moment.
set -euo pipefail
NAME=capture_fixtures.sh SUBDIR="" UP_OPTIONS=--fresh
# shellcheck source=scripts/capture_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/capture_common.sh"
# The JSON generations this version's commands accept, newest last.
GENERATIONS=()
for g in v0.0.38 v0.0.39 v0.0.40 v0.0.41 v0.0.42 v0.0.43 v0.0.44 v0.0.45; do
    squeue --json="$g" >/dev/null 2>&1 && GENERATIONS+=("$g")
done
((${#GENERATIONS[@]})) || GENERATIONS=(default) # 22.05: plain --json only
# The generation a plain --json writes (what the daemon reads), as "0.0.NN".
DEFAULT=$(squeue --json | python3 -c 'import json, sys
plugin = json.load(sys.stdin)["meta"]["plugin"]
print((plugin["type"] or plugin["data_parser"]).rsplit("/v", 1)[1])')
rows=()

record() { # file command...: run it, keep its stdout, note it
    local file=$1
    shift
    "$@" >"$OUT/$file"
    local command="$*"
    rows+=("| \`$file\` | \`${command//|/\\|}\` | $MOMENT |") # a "|" would end the cell
}

label() { # generation -> file label ("0.0.42"; 22.05's plain --json: its default)
    if [[ $1 == default ]]; then echo "$DEFAULT"; else echo "${1#v}"; fi
}

flag() { # generation -> --json option
    if [[ $1 == default ]]; then echo --json; else echo "--json=$1"; fi
}

text_reads() { # label: the text reads of the jobs
    record "squeue-O-$1.txt" squeue -h -a -t all -O "$SQUEUE_FORMAT"
    record "scontrol-o-show-job-$1.txt" scontrol -o show job
}

json_reads() { # label: every JSON read the daemon makes, in every generation
    local g
    for g in "${GENERATIONS[@]}"; do
        record "squeue-$1.$(label "$g").json" squeue "$(flag "$g")" -a -t all
        record "sinfo-$1.$(label "$g").json" sinfo "$(flag "$g")"
        if scontrol "$(flag "$g")" show nodes >/dev/null 2>&1; then
            record "scontrol-nodes-$1.$(label "$g").json" scontrol "$(flag "$g")" show nodes
        fi
    done
    text_reads "$1"
}

wait_state() { # job state (every component of a het job)
    local i
    for i in $(seq 100); do
        [[ $(squeue -h -j "$1" -o %T 2>/dev/null | sort -u) == "$2" ]] && return 0
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

MOMENT="3: het1 running, requeue1 requeued, held23 held, dep1 waiting on het1"
scancel "$RUN4" "$RANGE"
HETSCRIPT=$(mktemp /tmp/capture-het.XXXXXX)
printf '#!/bin/bash\n#SBATCH -J het1 -p shared -N1\n#SBATCH hetjob\n#SBATCH -N1\nsleep 600\n' >"$HETSCRIPT"
HET=$(S "$HETSCRIPT")
rm -f "$HETSCRIPT"
wait_state "$HET" RUNNING
REQ=$(S -N1 -p shared -J requeue1 --wrap 'sleep 600')
wait_state "$REQ" RUNNING
sleep 1 # a requeue in the second the job started leaves a zero-length record
scontrol requeue "$REQ"
wait_state "$REQ" PENDING
HOLD=$(S -N2-3 -J held23 --hold --comment='elastic:min=2,max=3' --wrap 'sleep 600')
DEP=$(S -N1 -J dep1 --dependency=afterok:"$HET" --wrap 'sleep 600')
NL=$(S -N1 -J nl1 --hold --comment=$'two\nlines' --wrap $'sleep 600\necho JobId=1 JobState=FAKE')
sleep 3
record "squeue-het.$DEFAULT.json" squeue --json -a -t all
if scontrol --json show nodes >/dev/null 2>&1; then # the daemon's node read: idle and mixed nodes
    record "scontrol-nodes-het.$DEFAULT.json" scontrol --json show nodes
else
    record "sinfo-het.$DEFAULT.json" sinfo --json
fi
if scontrol --json show job "$HET" >/dev/null 2>&1; then # the backend's read_job (24.11+)
    record "scontrol-show-job-het1.$DEFAULT.json" scontrol --json show job "$HET"
fi
text_reads het

MOMENT="4: all cancelled, done1 completed"
scancel "$HET" "$REQ" "$HOLD" "$DEP" "$NL"
DONE=$(S -N1 -J done1 --comment=elastic --wrap 'sleep 1')
# sacct shows stale data for a while after a short job ends (SLURM-FACTS.md): 22.05
# once gave COMPLETED with job name "allocation" and no partition 3 s later.
for _ in $(seq 100); do
    [[ $(sacct -n -X -P -j "$DONE" -S "$T0" -o state,jobname,partition) == COMPLETED\|done1\|batch ]] && break
    sleep 0.3
done
sleep 3
JOBS="$RUN4,$RANGE,$DONE,$PEND4,$HET,$REQ,$HOLD,$NL"
for g in "${GENERATIONS[@]}"; do
    # -D as the backend: 24.11+ leave a requeued job's earlier runs out of --json without it
    record "sacct.$(label "$g").json" sacct -a -D "$(flag "$g")" -S "$T0" -j "$JOBS"
done
record sacct-P.txt sacct -a -X -D -p -n --noconvert --delimiter="$SEPARATOR" -o "$SACCT_FIELDS" -S "$T0" -j "$JOBS"

{
    echo "# Slurm $(scontrol --version | awk '{print $2}') fixtures (captured from a local test cluster)"
    echo
    echo "Captured $(date -u +%F) by \`bash scripts/capture_fixtures.sh --slurm $SLURM --instance $INSTANCE\`"
    echo "(the scenario is in that script's header) on instance $INSTANCE of \`scripts/cluster.sh\`"
    echo "(4 nodes n1..n4, 4 CPUs and 4 fake GPUs each; partitions \`batch\` (default,"
    echo "OverSubscribe=EXCLUSIVE) and \`shared\`), TZ=UTC.  JSON generations offered:"
    if [[ ${GENERATIONS[*]} == default ]]; then
        echo "v$DEFAULT only, as a plain --json (\`.0.0.NN.json\`)."
    else
        echo "${GENERATIONS[*]} (\`.0.0.NN.json\` is \`--json=v0.0.NN\`; a plain --json"
        echo "is v$DEFAULT)."
    fi
    echo "Jobs: run4=$RUN4 pend4=$PEND4 range24=$RANGE shared24=$SHARED het1=$HET"
    echo "(components $HET and $((HET + 1))) requeue1=$REQ held23=$HOLD dep1=$DEP nl1=$NL"
    echo "done1=$DONE."
    echo
    echo "| file | command | moment |"
    echo "|---|---|---|"
    printf '%s\n' "${rows[@]}"
} >"$OUT/CAPTURED.md"
scancel -u root >/dev/null 2>&1 || true
echo "captured ${#rows[@]} files into $OUT"
