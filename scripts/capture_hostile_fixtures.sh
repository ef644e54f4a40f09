#!/usr/bin/env bash
# Capture what a hostile user's jobs look like in every read the daemon makes, from a real
# local cluster, as parser fixtures.
#
#   bash scripts/capture_hostile_fixtures.sh --slurm V [--instance K] [--out DIR]
#
# Uses instance K (default 5) of version V as it is (no --fresh: it may be shared with
# the live tests of the same engineer; jobs are told apart by id) and writes to DIR
# (default tests/fixtures/slurm/V/hostile/), with CAPTURED.md naming the jobs.
#
# Scenario (se-bob and se-alice are the unprivileged test users, `make setup`):
#   se-bob, held: badbytes (comment elastic<FE><FF>, name bad<FE>name), newline (-N1-2,
#     name "na<LF>me|x", comment "elastic:min=1,max=2<LF>X"), forged (a comment whose
#     second line is a whole `squeue -O` row and a whole old `sacct -P` row in se-alice's
#     name, with '|' as separator, as the review's attack wrote them);
#   se-alice, held: honest (-N1-3 --comment=elastic);
#   then, to completion on the shared partition: se-bob's forgedone (the forged comment) and
#   se-alice's alicedone (--comment=elastic), for the accounting reads.
set -euo pipefail
NAME=capture_hostile_fixtures.sh SUBDIR=hostile UP_OPTIONS=""
# shellcheck source=scripts/capture_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/capture_common.sh"

as() { # user sbatch-args...: submit as that user, print the job id
    local user=$1
    shift
    runuser -u "$user" -- sbatch --parsable -o /dev/null -D /tmp "$@" | cut -d';' -f1
}
NOW=$(date +%Y-%m-%dT%H:%M:%S)
FAKE_SQUEUE="4242|N/A|N/A|RUNNING|4|4|n[1-4]|n1|UNLIMITED|$NOW|$NOW|N/A|0|None|se-alice|1001|default|batch|normal|cpu=16,node=4|N/A|(null)|/home/se-alice|fake|elastic:min=1,max=4"
FAKE_SACCT="4242|4242|COMPLETED|4|n[1-4]|$NOW|$NOW|$NOW|se-alice|default|batch|/home/se-alice|train|elastic"
FORGED=$'forged\n'"$FAKE_SQUEUE"$'\n'"$FAKE_SACCT"

BADBYTES=$(as se-bob --hold -N1 -J $'bad\xfename' --comment=$'elastic\xfe\xff' --wrap 'sleep 60')
NEWLINE=$(as se-bob --hold -N1-2 -J $'na\nme|x' --comment=$'elastic:min=1,max=2\nX' --wrap 'sleep 60')
FORGEDJOB=$(as se-bob --hold -N1 -J forged --comment="$FORGED" --wrap 'sleep 60')
HONEST=$(as se-alice --hold -N1-3 -J honest --comment=elastic --wrap 'sleep 60')
FORGEDONE=$(as se-bob -p shared -N1 -J forgedone --comment="$FORGED" --wrap true)
ALICEDONE=$(as se-alice -p shared -N1 -J alicedone --comment=elastic --wrap true)
JOBS="$BADBYTES,$NEWLINE,$FORGEDJOB,$HONEST,$FORGEDONE,$ALICEDONE"

squeue --json -a -t all >"$OUT/squeue.json.all"
# Only this scenario's jobs: 22.05's squeue --json ignores -j, so filter the document.
python3 - "$OUT/squeue.json.all" "$OUT/squeue.json" "$JOBS" <<'EOF'
import json, sys
source, target, ids = sys.argv[1], sys.argv[2], {int(i) for i in sys.argv[3].split(",")}
raw = open(source, "rb").read()
doc = json.loads(raw.decode("utf-8", "surrogateescape"))
doc["jobs"] = [j for j in doc["jobs"] if j["job_id"] in ids]
text = json.dumps(doc, indent=1, ensure_ascii=False)
open(target, "wb").write(text.encode("utf-8", "surrogateescape"))  # the bytes as Slurm wrote them
EOF
rm "$OUT/squeue.json.all"
squeue -h -a -t all -j "$JOBS" -O "$SQUEUE_FORMAT" >"$OUT/squeue-O.txt"
# sacct shows stale data for a while after a short job ends (SLURM-FACTS.md).
for _ in $(seq 100); do
    done_states=$(sacct -n -X -P -j "$FORGEDONE,$ALICEDONE" -S "$T0" -o state | sort -u)
    [[ $done_states == COMPLETED ]] && break
    sleep 0.3
done
sleep 3
sacct -a -X -D -p -n --noconvert --delimiter="$SEPARATOR" -o "$SACCT_FIELDS" -S "$T0" -j "$JOBS" >"$OUT/sacct-p.txt"
sacct -a -D --json -S "$T0" -j "$JOBS" >"$OUT/sacct.json"
scancel "$BADBYTES" "$NEWLINE" "$FORGEDJOB" "$HONEST"
{
    echo "# Hostile jobs on Slurm $(scontrol --version | awk '{print $2}') (captured from a local test cluster)"
    echo
    echo "Captured $(date -u +%F) by \`bash scripts/capture_hostile_fixtures.sh --slurm $SLURM"
    echo "--instance $INSTANCE\` (the scenario is in that script's header), TZ=UTC.  Raw bytes as"
    echo "Slurm printed them (the 0xFE/0xFF bytes are in the files; \`squeue.json\` is"
    echo "\`squeue --json -a -t all\` kept to these jobs, re-serialised byte for byte)."
    echo "Text reads use \`parse_text.CAPTURE_SEPARATOR\` as the separator."
    echo
    echo "Jobs: badbytes=$BADBYTES newline=$NEWLINE forged=$FORGEDJOB honest=$HONEST"
    echo "forgedone=$FORGEDONE alicedone=$ALICEDONE.  The forged comment's second and third"
    echo "lines are a whole old-style \`squeue -O\` row and \`sacct -P\` row for job 4242 of se-alice."
    echo
    echo "| file | command |"
    echo "|---|---|"
    echo "| \`squeue.json\` | \`squeue --json -a -t all\` (these jobs) |"
    echo "| \`squeue-O.txt\` | \`squeue -h -a -t all -j JOBS -O <squeue_format(CAPTURE_SEPARATOR)>\` |"
    echo "| \`sacct-p.txt\` | \`sacct -a -X -D -p -n --noconvert --delimiter=<CAPTURE_SEPARATOR> -o SACCT_FIELDS -S T0 -j JOBS\` |"
    echo "| \`sacct.json\` | \`sacct -a -D --json -S T0 -j JOBS\` |"
    echo
    echo "Job ids: $JOBS"
} >"$OUT/CAPTURED.md"
echo "captured into $OUT: jobs $JOBS"
