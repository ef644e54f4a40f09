#!/usr/bin/env bash
# `make test`: the suite on every Slurm version of the matrix, one leg after another.
#
#   bash scripts/test-matrix.sh [--instance K] [--legs "22.05 24.11 26.05 ..."]
#
# Legs (each brings its cluster up first; a cluster that cannot come up fails the leg):
#   unit           the tests that need no cluster (`-m "not slurm"`), on two pytest-xdist
#                  workers (they share nothing; the live tests share one cluster, so they
#                  run one at a time)
#   22.05          the live-cluster tests (`-m slurm`) on the host's Slurm 22.05, the
#                  default version: those marked default_slurm_only run here alone
#   24.11, 26.05   the live-cluster tests (`-m slurm`: backend, daemon, markers, the torch
#                  end-to-end and demo tests) on Debian's 24.11 and 26.05
#   parser-24.11   the live backend and parser tests on 24.11 with a site's non-default
#                  data_parser (DataParserParameters=v0.0.40): the reads name their own
#   pyslurm-24.11  the live backend and hostile-read tests (both backends: some compare the
#                  two, so no -k selects the pyslurm ones alone) inside the 24.11 root, where a
#                  pyslurm built against that root's libslurm loads (built first, once:
#                  scripts/build-pyslurm.sh --root); the 22.05 leg runs them on the host.
#                  26.05 has no pyslurm release: CLI only (the backend selection says so).
# Under CI (CI set) a missing cluster fails, never skips (tests/slurm_cluster.py).
# Last line: "N passed, N failed" over every leg; before it, one line per leg.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
PYTHON=${PYTHON:-python3}
INSTANCE=${SLURM_ELASTIC_TEST_INSTANCE:-0}
LEGS=${TEST_LEGS:-"unit 22.05 24.11 26.05 parser-24.11 pyslurm-24.11"}
while [[ $# -gt 0 ]]; do
    case $1 in
        --instance) INSTANCE=${2:?}; shift 2 ;;
        --legs) LEGS=${2:?}; shift 2 ;;
        *) echo "test-matrix.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
cd "$REPO" || exit 2
export SLURM_ELASTIC_TEST_INSTANCE=$INSTANCE

summary=()
total_passed=0
total_failed=0
rc=0

# The pyslurm leg's build (~4 min of gcc, the first time) runs in the background, niced,
# while the 22.05 leg runs: that leg mostly waits on Slurm and torch's sample sleeps, so its
# tests keep the CPU they use; the pyslurm leg then finds the build done (or builds it
# itself, with its error, if the background build failed).
PREBUILD_PID=""
PREBUILD_LOG=$(mktemp)
prebuild_pyslurm() { # version
    local version=$1
    (bash scripts/cluster.sh up --slurm "$version" --instance "$INSTANCE" \
        --nodes "${SLURM_ELASTIC_TEST_NODES:-4}" &&
        nice -n 19 bash scripts/build-pyslurm.sh --slurm "$version" \
            --root "$(root_of "$version")") >"$PREBUILD_LOG" 2>&1 &
    PREBUILD_PID=$!
    echo "=== pyslurm $version: building in the background (pid $PREBUILD_PID, log $PREBUILD_LOG)"
}

count() { # word summary-line: the number before "word" in pytest's last line, else 0
    grep -oE "[0-9]+ $1" <<<"$2" | head -n 1 | cut -d' ' -f1 || true
}

run_leg() { # name version pytest-args...  (IN_ROOT=1: pytest runs inside the version's root)
    local name=$1 version=$2 log line passed failed errors code t0=$SECONDS
    local run=("$PYTHON")
    shift 2
    log=$(mktemp)
    local conf=() setting
    # SLURM_ELASTIC_TEST_CONF: the leg's extra slurm.conf lines (tests/slurm_cluster.py too).
    for setting in ${SLURM_ELASTIC_TEST_CONF:-}; do conf+=(--conf "$setting"); done
    echo "=== leg $name: Slurm $version, instance $INSTANCE${conf[*]:+ (${conf[*]})}: pytest $*"
    if ! bash scripts/cluster.sh up --slurm "$version" --instance "$INSTANCE" \
        --nodes "${SLURM_ELASTIC_TEST_NODES:-4}" "${conf[@]}" 2>&1 | tee "$log"; then
        # The reason goes into the summary too: CI shows only the end of the output.
        summary+=("$name: cluster did not come up: $(grep -m 1 '^cluster.sh: ' "$log")")
        rm -f "$log"
        total_failed=$((total_failed + 1))
        rc=1
        return
    fi
    if [[ $name == 22.05 && " $LEGS " == *" pyslurm-24.11 "* ]]; then
        prebuild_pyslurm 24.11
    fi
    if ((${IN_ROOT:-0})); then
        if [[ -n $PREBUILD_PID ]]; then
            wait "$PREBUILD_PID" || echo "=== background pyslurm build failed: $(tail -n 1 "$PREBUILD_LOG")"
            PREBUILD_PID=""
        fi
        # The interpreter itself (no pyenv shim): the same path works inside the root.
        run=(bash scripts/cluster.sh exec --slurm "$version" --instance "$INSTANCE" --
            "$("$PYTHON" -c 'import sys; print(sys.executable)')")
        if ! bash scripts/build-pyslurm.sh --slurm "$version" --root "$(root_of "$version")"; then
            summary+=("$name: pyslurm did not build")
            total_failed=$((total_failed + 1))
            rc=1
            return
        fi
    fi
    SLURM_ELASTIC_SLURM=$version "${run[@]}" -m pytest "$@" 2>&1 | tee "$log"
    code=${PIPESTATUS[0]}
    line=$(grep -E '^=*.*[0-9]+ (passed|failed|error)' "$log" | tail -n 1)
    rm -f "$log"
    passed=$(count passed "$line")
    failed=$(count failed "$line")
    errors=$(count error "$line")
    passed=${passed:-0} failed=$((${failed:-0} + ${errors:-0}))
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed))
    # pytest's 5 = nothing collected: a leg that ran no test is a failure, not a pass.
    if ((code != 0)); then rc=1; fi
    summary+=("$name: $passed passed, $failed failed (exit $code, $((SECONDS - t0)) s)")
}

root_of() { # version: its root directory, as cluster.sh prints it
    bash scripts/cluster.sh root --slurm "$1" | sed -n 's/^Slurm [0-9.]*: //p' | tail -n 1
}

for leg in $LEGS; do
    case $leg in
        unit) run_leg unit 22.05 -q --durations=20 -n 2 -m "not slurm" tests ;;
        22.05 | 24.11 | 26.05) run_leg "$leg" "$leg" -q --durations=20 -m slurm tests ;;
        parser-24.11) SLURM_ELASTIC_TEST_CONF=DataParserParameters=v0.0.40 run_leg "$leg" 24.11 \
            -q -m slurm tests/test_slurm_backend_live.py tests/test_slurm_parse_live.py \
            -k "not history_keeps and not resized_twice" ;; # sacct's JSON: the names test reads it
        pyslurm-24.11) IN_ROOT=1 run_leg "$leg" 24.11 -q -m slurm tests/test_slurm_backend_live.py \
            tests/test_hostile_read_live.py ;;
        *) echo "test-matrix.sh: unknown leg '$leg'" >&2; exit 2 ;;
    esac
done

[[ -z $PREBUILD_PID ]] || wait "$PREBUILD_PID" # a leg list that stopped before the pyslurm leg
rm -f "$PREBUILD_LOG"
echo "=== per-version results (instance $INSTANCE)"
printf '%s\n' "${summary[@]}"
echo "$total_passed passed, $total_failed failed"
exit $rc
