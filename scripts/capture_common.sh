# Sourced by the fixture capture scripts (capture_fixtures.sh, capture_hostile_fixtures.sh):
# reads `--slurm V [--instance K] [--out DIR]`, brings instance K (default 5) of V up,
# applies its environment and sets REPO, SLURM, INSTANCE, OUT (default
# tests/fixtures/slurm/V/$SUBDIR), T0 (now) and, from the parsers, SEPARATOR (the text
# fixtures' separator), SQUEUE_FORMAT and SACCT_FIELDS.  The caller sets NAME (its own name,
# for errors), SUBDIR ("" or a folder) and UP_OPTIONS (extra `cluster.sh up` options).
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
SLURM="" INSTANCE=5 OUT=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --slurm) SLURM=${2:?}; shift 2 ;;
        --instance) INSTANCE=${2:?}; shift 2 ;;
        --out) OUT=${2:?}; shift 2 ;;
        *) echo "$NAME: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
[[ -n $SLURM ]] || { echo "$NAME: --slurm V is required" >&2; exit 2; }
OUT=${OUT:-$REPO/tests/fixtures/slurm/$SLURM${SUBDIR:+/$SUBDIR}}
mkdir -p "$OUT"
# shellcheck disable=SC2086 # UP_OPTIONS is a list of words
bash "$HERE/cluster.sh" up --slurm "$SLURM" --instance "$INSTANCE" $UP_OPTIONS >/dev/null
eval "$(bash "$HERE/cluster.sh" env --slurm "$SLURM" --instance "$INSTANCE")"
export TZ=UTC # text timestamps are local time: the tests parse them with TZ=UTC
cd /tmp
# `up --fresh` restarts job ids at 1 but keeps the accounting database: sacct must not
# see the jobs of an earlier run under the same ids.
T0=$(date +%Y-%m-%dT%H:%M:%S)
parsers() { (cd "$REPO" && python3 -c "from slurm_elastic.slurm.parse_text import *; $1"); }
SEPARATOR=$(parsers 'print(CAPTURE_SEPARATOR)')
SQUEUE_FORMAT=$(parsers 'print(squeue_format(CAPTURE_SEPARATOR))')
SACCT_FIELDS=$(parsers 'print(",".join(SACCT_FIELDS))')
