#!/usr/bin/env bash
# Build pyslurm for one Slurm release from the vendored upstream archive (run as root).
#
#   bash scripts/build-pyslurm.sh --slurm 22.05 [--root DIR] [--vendor DIR] [--prefix DIR]
#
# pyslurm X.Y builds only against Slurm X.Y and PyPI has no release for 22.05 or 24.11, so
# the upstream branch archives live in ../shared/vendor (checked against its SHA256SUMS).
# The build goes to a version-specific directory, never site-packages:
#   PREFIX/<slurm>  (default /var/lib/slurm-elastic/pyslurm/22.05)
# so that builds for several Slurm releases sit side by side and each cluster's
# environment puts the right one on PYTHONPATH (slurm_elastic.slurm.select.pyslurm_dir).
#
# --root DIR builds inside a chroot with its libslurm-dev (the Debian 13 root of
# scripts/cluster.sh for 24.11, whose cluster must be up so that the host's Python is seen
# there) and the host's Python; the result lands in PREFIX/<slurm> as the root sees it
# (<root>PREFIX/<slurm> on the host).  Without --root the host's libslurm is used.
#
# Idempotent: skips (one line, exit 0) when PREFIX/<slurm> already holds a build of this
# archive for this Python (BUILD-INFO written after a successful build and import check).
# Output: one line on success, one line on failure; the whole build log is kept in
# /var/log/slurm-elastic/build-pyslurm-<slurm>.log (/tmp when /var/log is not writable).
# PYTHON selects the host interpreter (default python3; ignored with --root).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
SLURM=""
ROOT=""
VENDOR="$REPO/../shared/vendor"
PREFIX=/var/lib/slurm-elastic/pyslurm
PYTHON=${PYTHON:-python3}

die() {
    echo "build-pyslurm: $*" >&2
    exit 1
}

while [[ $# -gt 0 ]]; do
    case $1 in
        --slurm) SLURM=${2:?--slurm needs a value}; shift 2 ;;
        --slurm=*) SLURM=${1#*=}; shift ;;
        --root) ROOT=${2:?--root needs a value}; shift 2 ;;
        --root=*) ROOT=${1#*=}; shift ;;
        --vendor) VENDOR=${2:?--vendor needs a value}; shift 2 ;;
        --vendor=*) VENDOR=${1#*=}; shift ;;
        --prefix) PREFIX=${2:?--prefix needs a value}; shift 2 ;;
        --prefix=*) PREFIX=${1#*=}; shift ;;
        -h | --help) sed -n '2,3p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (usage: --slurm 22.05 [--root DIR])" ;;
    esac
done

# Slurm "22.05" -> pyslurm series "22.5" (pyslurm drops the leading zero of the minor).
[[ $SLURM =~ ^([0-9]{2})\.([0-9]{2})$ ]] || die "--slurm needs a Slurm release like 22.05, got '${SLURM}'"
SERIES="${BASH_REMATCH[1]}.$((10#${BASH_REMATCH[2]}))"
ARCHIVE="pyslurm-${SERIES}.x.tar.gz"
TARGET="$PREFIX/$SLURM"
[[ $(id -u) -eq 0 ]] || die "must run as root (writes $PREFIX and /var/log)"
if [[ -n $ROOT ]]; then
    # The build runs inside the root with the host's own Python (the one the tests and the
    # daemon use; scripts/cluster.sh bind-mounts /root, /tmp and the repository there), so
    # the root's cluster must be up.  The result lands at PREFIX/<slurm> as seen inside the
    # root, i.e. <root>PREFIX/<slurm> here.
    mountpoint -q "$ROOT/tmp" ||
        die "$ROOT is not mounted: bring its cluster up first (scripts/cluster.sh up --slurm $SLURM)"
    TARGET=$ROOT$PREFIX/$SLURM
    PREFIX=$ROOT$PREFIX
fi

# ------------------------------------------------------------------ the archive
[[ -f $VENDOR/$ARCHIVE ]] || die "no $ARCHIVE in $VENDOR (pyslurm for Slurm $SLURM is not vendored)"
[[ -f $VENDOR/SHA256SUMS ]] || die "no SHA256SUMS in $VENDOR"
WANT=$(awk -v f="$ARCHIVE" '$2 == f || $2 == "*" f {print $1}' "$VENDOR/SHA256SUMS")
[[ -n $WANT ]] || die "$ARCHIVE is not listed in $VENDOR/SHA256SUMS"
HAVE=$(sha256sum "$VENDOR/$ARCHIVE" | cut -d' ' -f1)
[[ $HAVE == "$WANT" ]] || die "$VENDOR/$ARCHIVE: SHA256 $HAVE does not match SHA256SUMS ($WANT)"

# ------------------------------------------------------------------ in the root or here
in_root() { # run a command with the build's python environment (the chroot's, or ours)
    if [[ -n $ROOT ]]; then chroot "$ROOT" "$@"; else "$@"; fi
}
# The interpreter itself, not a shim: the same path must work inside the root.
PY=$("$PYTHON" -c 'import sys; print(sys.executable)') || die "cannot run $PYTHON"
EXT_SUFFIX=$(in_root "$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))') ||
    die "cannot run $PY${ROOT:+ in $ROOT}"
STAMP="slurm=$SLURM archive=$ARCHIVE sha256=$HAVE ext=$EXT_SUFFIX"
if [[ -f $TARGET/BUILD-INFO ]] && [[ $(head -n1 "$TARGET/BUILD-INFO") == "$STAMP" ]]; then
    echo "build-pyslurm: $TARGET already holds pyslurm $SERIES for Slurm $SLURM ($EXT_SUFFIX); skipped"
    exit 0
fi

LOGDIR=/var/log/slurm-elastic
mkdir -p "$LOGDIR" 2>/dev/null && [[ -w $LOGDIR ]] || LOGDIR=/tmp
LOG="$LOGDIR/build-pyslurm-$SLURM.log"
: >"$LOG"
fail() {
    echo "build-pyslurm: $* (log: $LOG)" >&2
    exit 1
}

# Scratch space the build environment can see: inside the root when there is one.
SCRATCH_HOST=$(mktemp -d "${ROOT:+$ROOT}/tmp/build-pyslurm.XXXXXX")
SCRATCH=${SCRATCH_HOST#"$ROOT"}
trap 'rm -rf "$SCRATCH_HOST"' EXIT
cp "$VENDOR/$ARCHIVE" "$SCRATCH_HOST/"

# libslurm-dev puts libslurm.so (the name pyslurm's setup.py looks for) in the multiarch dir.
LIBDIR=$(in_root "$PY" -c 'import sysconfig; print("/usr/lib/" + sysconfig.get_config_var("MULTIARCH"))')
in_root test -e "$LIBDIR/libslurm.so" ||
    fail "no $LIBDIR/libslurm.so${ROOT:+ in $ROOT}: install libslurm-dev for Slurm $SLURM"
# slurm_version.h has only "#define SLURM_VERSION_NUMBER 0x160508" (22.05.8).
HEX=$(printf '0x%02x%02x' "$((10#${SLURM%%.*}))" "$((10#${SLURM#*.}))")
in_root grep -q "^#define SLURM_VERSION_NUMBER $HEX" /usr/include/slurm/slurm_version.h ||
    fail "/usr/include/slurm/slurm_version.h${ROOT:+ in $ROOT} is not Slurm $SLURM"

# pip inside the root trusts what this machine's pip trusts (a site may put its own CA in
# front of the package index): the host's bundle, copied where the root sees it.
PIP_TRUST=()
if [[ -n $ROOT ]]; then
    bundle=$("$PYTHON" -m pip config get global.cert 2>/dev/null || true)
    bundle=${PIP_CERT:-${bundle:-/etc/ssl/certs/ca-certificates.crt}}
    if [[ -f $bundle ]]; then
        cp "$bundle" "$SCRATCH_HOST/ca-bundle.crt"
        PIP_TRUST=(PIP_CERT="$SCRATCH/ca-bundle.crt" REQUESTS_CA_BUNDLE="$SCRATCH/ca-bundle.crt"
            SSL_CERT_FILE="$SCRATCH/ca-bundle.crt")
    fi
fi
started=$(date +%s)
{
    echo "== $(date -Is) building $ARCHIVE ($STAMP)${ROOT:+ in $ROOT}"
    # pip builds in an isolated environment with the archive's own pins (setuptools,
    # wheel, Cython<3) from the package index, and installs into a staging directory.
    in_root env SLURM_LIB_DIR="$LIBDIR" SLURM_INCLUDE_DIR=/usr/include "${PIP_TRUST[@]}" \
        "$PY" -m pip install --no-deps --no-cache-dir --no-input --disable-pip-version-check \
        --target "$SCRATCH/target" "$SCRATCH/$ARCHIVE"
} >>"$LOG" 2>&1 || fail "pip could not build $ARCHIVE against Slurm $SLURM"

# Import check: pyslurm's __init__ runs slurm_init(), which reads a slurm.conf, so give it
# a minimal one (no cluster needed: nothing is contacted).
cat >"$SCRATCH_HOST/slurm.conf" <<'EOF'
ClusterName=buildcheck
SlurmctldHost=localhost
NodeName=n1 CPUs=1
PartitionName=p Nodes=n1
EOF
{
    echo "== import check"
    in_root env PYTHONPATH="$SCRATCH/target" SLURM_CONF="$SCRATCH/slurm.conf" "$PY" -c '
import sys
import pyslurm
version = pyslurm.__version__  # 22.5: also pyslurm.version(); 24.11: version is a module
print("pyslurm", version, "from", pyslurm.__file__)
sys.exit(0 if version.startswith(sys.argv[1] + ".") else 1)' "$SERIES"
} >>"$LOG" 2>&1 || fail "the built pyslurm does not import or is not $SERIES.*"
# The version file itself (importing pyslurm needs a slurm.conf): __version__.py in 22.5,
# version.py from 23.x on.
VERSION=$(in_root env PYTHONPATH="$SCRATCH/target" "$PY" -c '
import pathlib, runpy, sys
package = pathlib.Path(sys.argv[1])
name = next(n for n in ("__version__.py", "version.py") if (package / n).is_file())
print(runpy.run_path(str(package / name))["__version__"])' "$SCRATCH/target/pyslurm")

echo "$STAMP" >"$SCRATCH_HOST/target/BUILD-INFO"
echo "pyslurm=$VERSION built=$(date -Is)" >>"$SCRATCH_HOST/target/BUILD-INFO"
# Swap the old build out by renames inside PREFIX, so a reader never sees a half-copied one.
mkdir -p "$PREFIX"
rm -rf "$TARGET.new" "$TARGET.old"
mv "$SCRATCH_HOST/target" "$TARGET.new"
[[ ! -e $TARGET ]] || mv "$TARGET" "$TARGET.old"
mv "$TARGET.new" "$TARGET"
rm -rf "$TARGET.old"
echo "build-pyslurm: pyslurm $VERSION for Slurm $SLURM in $TARGET ($(($(date +%s) - started)) s; log: $LOG)"
