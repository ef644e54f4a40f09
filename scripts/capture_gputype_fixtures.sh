#!/usr/bin/env bash
# Capture the node reads of a cluster with typed GPUs (`cluster.sh up --gpu-types`), from a
# real local cluster, as parser fixtures: what NodeView.gpu_type and
# cluster_state.partition_gpu_types are read from.
#
#   bash scripts/capture_gputype_fixtures.sh --slurm V [--instance K] [--out DIR]
#
# Brings instance K (default 5) of version V up with `--gpu-types a100:2,t4:2` (n1-n2
# gpu:a100:4 and partition a100, n3-n4 gpu:t4:4 and partition t4, beside batch and shared):
# that restarts an instance that was up without it, and cancels every job of the instance.
# Writes to DIR (default tests/fixtures/slurm/V/gputypes/), with CAPTURED.md.
#
# Moment: `-p a100 -w n1 --gres=gpu:a100:1` runs (partition a100 is OverSubscribe=EXCLUSIVE,
# so n1 is allocated with all its GPUs), `-p shared -w n3 --gres=gpu:t4:2` runs (n3 mixed,
# two t4 in use), n4 drained.  Read: the node read the daemon makes (22.05: `sinfo --json`;
# later versions: `scontrol --json=vX show nodes` in every JSON generation offered), `scontrol
# -o show partition` and, where a pyslurm build for V imports on the host (22.05),
# `pyslurm.node().get()`.  Each node record is trimmed to the fields the parsers read (and
# the gres/TRES fields beside them), `meta` kept whole; the rest of Slurm's ~60 fields per
# node is left out to keep the files small.  Afterwards the jobs are cancelled and n4 resumed.
set -euo pipefail
NAME=capture_gputype_fixtures.sh SUBDIR=gputypes UP_OPTIONS="--gpu-types a100:2,t4:2"
# shellcheck source=scripts/capture_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/capture_common.sh"

# shellcheck disable=SC2046 # job ids are words
scancel $(squeue -h -o %A) 2>/dev/null || true
S() { sbatch --parsable -o /dev/null -D /tmp "$@" | cut -d';' -f1; }
A100=$(S -p a100 -w n1 -N1 --gres=gpu:a100:1 -J a100job --wrap 'sleep 600')
T4=$(S -p shared -w n3 -N1 -n1 --gres=gpu:t4:2 -J t4job --wrap 'sleep 600')
scontrol update NodeName=n4 State=DRAIN Reason=gputypes-capture
for _ in $(seq 100); do
    [[ $(squeue -h -j "$A100,$T4" -o %T | sort -u) == RUNNING ]] && break
    sleep 0.2
done
[[ $(squeue -h -j "$A100,$T4" -o %T | sort -u) == RUNNING ]] ||
    { echo "$NAME: jobs $A100 $T4 did not start" >&2; exit 1; }

# Keep `meta` and, per node, the fields the parsers read plus the gres/TRES ones beside them.
TRIM='import json, sys
KEEP = ("name", "state", "state_flags", "cpus", "alloc_cpus", "gres", "gres_used",
        "gres_drained", "partitions", "reason", "tres", "tres_used")
doc = json.load(sys.stdin)
if "nodes" in doc:  # sinfo / scontrol --json
    doc = {"meta": doc["meta"], "nodes": [{k: n[k] for k in KEEP if k in n} for n in doc["nodes"]],
           "errors": doc.get("errors", []), "warnings": doc.get("warnings", [])}
else:  # pyslurm.node().get(): name -> record
    doc = {name: {k: n[k] for k in KEEP if k in n} for name, n in doc.items()}
json.dump(doc, sys.stdout, indent=1, sort_keys=True, ensure_ascii=False)
print()'
rows=()
record() { # file command...: run it, trim its JSON, note it
    local file=$1
    shift
    "$@" | python3 -c "$TRIM" >"$OUT/$file"
    rows+=("| \`$file\` | \`$*\` |")
}
generations=()
for g in v0.0.40 v0.0.41 v0.0.42 v0.0.43 v0.0.44 v0.0.45; do
    scontrol --json="$g" show nodes >/dev/null 2>&1 && generations+=("$g")
done
if ((${#generations[@]})); then
    for g in "${generations[@]}"; do
        record "scontrol-nodes.${g#v}.json" scontrol --json="$g" show nodes
    done
else # 22.05: no scontrol --json; sinfo lists the nodes one by one
    record sinfo.0.0.38.json sinfo --json
fi
scontrol -o show partition >"$OUT/scontrol-o-show-partition.txt"
rows+=("| \`scontrol-o-show-partition.txt\` | \`scontrol -o show partition\` (not trimmed) |")
PYSLURM_DIR=/var/lib/slurm-elastic/pyslurm/$SLURM
pyslurm_nodes='import json, pyslurm; print(json.dumps(pyslurm.node().get()))'
if [[ -d $PYSLURM_DIR ]] && PYTHONPATH=$PYSLURM_DIR python3 -c 'import pyslurm' 2>/dev/null; then
    record pyslurm-nodes.json env PYTHONPATH="$PYSLURM_DIR" python3 -c "$pyslurm_nodes"
    rows[-1]="| \`pyslurm-nodes.json\` | \`pyslurm.node().get()\` (PYTHONPATH=$PYSLURM_DIR), stored with \`json.dumps\` |"
fi
scancel "$A100" "$T4"
scontrol update NodeName=n4 State=RESUME

{
    echo "# Typed GPUs: Slurm $(scontrol --version | cut -d' ' -f2) (\`gputypes/\`)"
    echo
    echo "Captured $(date -u +%Y-%m-%d) by \`bash scripts/capture_gputype_fixtures.sh --slurm $SLURM"
    echo "--instance $INSTANCE\` (its header has the scenario) on instance $INSTANCE, brought up with"
    echo "\`cluster.sh up --gpu-types a100:2,t4:2\`: n1-n2 \`Gres=gpu:a100:4\` (partition \`a100\`),"
    echo "n3-n4 \`Gres=gpu:t4:4\` (partition \`t4\`), all four in \`batch\` and \`shared\`.  At the"
    echo "moment read: job $A100 (\`-p a100 -w n1 --gres=gpu:a100:1\`) runs on n1 (allocated, all"
    echo "its GPUs: a100 is OverSubscribe=EXCLUSIVE), job $T4 (\`-p shared -w n3 --gres=gpu:t4:2\`)"
    echo "on n3 (mixed), n4 is drained.  JSON node records are trimmed to name, state,"
    echo "state_flags, cpus, alloc_cpus, gres, gres_used, gres_drained, partitions, reason, tres,"
    echo "tres_used (those present), \`meta\` kept whole."
    echo
    echo "| file | command |"
    echo "|---|---|"
    printf '%s\n' "${rows[@]}"
} >"$OUT/CAPTURED.md"
echo "$NAME: wrote $OUT"
