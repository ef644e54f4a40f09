#!/usr/bin/env bash
# Build (and install) the --elastic SPANK plugin for the installed Slurm.
#
#   bash scripts/build-spank.sh [--include DIR] [--out FILE] [--plugstack FILE]
#
# Compiles etc/spank/elastic.c against Slurm's <slurm/spank.h> (--include, default
# /usr/include: Debian's libslurm-dev on 22.05, 24.11 and 26.05 alike) into --out (default
# /usr/lib/slurm-elastic/spank/elastic.so), then prints the lines to add: one for
# plugstack.conf and, when slurm.conf names no PlugStackConfig, one for slurm.conf (the
# default plugstack.conf beside slurm.conf is not read when SLURM_CONF names another
# directory).  --plugstack FILE writes that plugstack.conf instead of printing its line.
#
# Slurm loads a SPANK plugin only when it was built for the same major.minor release
# ("Incompatible Slurm plugin version"): build again after every Slurm upgrade.  The file
# must be at the same path on the submit hosts (sbatch, salloc, srun read the option
# there) and on the compute nodes; "optional" lets a node without it run jobs anyway.
# The last line is the installed path.  Exits non-zero with one line on any failure.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SOURCE="$(dirname "$HERE")/etc/spank/elastic.c"
INCLUDE=/usr/include
OUT=/usr/lib/slurm-elastic/spank/elastic.so
PLUGSTACK=""

die() {
    echo "build-spank: $*" >&2
    exit 1
}

while [[ $# -gt 0 ]]; do
    case $1 in
        --include) INCLUDE=${2:?--include needs a value}; shift 2 ;;
        --include=*) INCLUDE=${1#*=}; shift ;;
        --out) OUT=${2:?--out needs a value}; shift 2 ;;
        --out=*) OUT=${1#*=}; shift ;;
        --plugstack) PLUGSTACK=${2:?--plugstack needs a value}; shift 2 ;;
        --plugstack=*) PLUGSTACK=${1#*=}; shift ;;
        -h | --help) sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (see: build-spank.sh --help)" ;;
    esac
done

[[ $OUT == /* ]] || die "--out must be an absolute path (Slurm loads it by that path), got '$OUT'"
[[ -f $INCLUDE/slurm/spank.h ]] ||
    die "no $INCLUDE/slurm/spank.h: install Slurm's headers (Debian: apt-get install libslurm-dev)"
command -v gcc >/dev/null || die "gcc not found (Debian: apt-get install gcc libc6-dev)"
# 0x160508 -> 22.05.8
number=$(sed -n 's/^#define SLURM_VERSION_NUMBER 0x\([0-9a-fA-F]\{6\}\).*/\1/p' \
    "$INCLUDE/slurm/slurm_version.h")
[[ -n $number ]] || die "no SLURM_VERSION_NUMBER in $INCLUDE/slurm/slurm_version.h"
version=$(printf '%02d.%02d.%d' "0x${number:0:2}" "0x${number:2:2}" "0x${number:4:2}")

install -d "$(dirname "$OUT")"
tmp=$(mktemp "$OUT.XXXXXX")
trap 'rm -f "$tmp"' EXIT
out=$(gcc -shared -fPIC -O2 -Wall -Wextra -Werror -I"$INCLUDE" -o "$tmp" "$SOURCE" 2>&1) ||
    die "gcc failed on $SOURCE against $INCLUDE: $(head -n 3 <<<"$out" | tr '\n' ' ')"
chmod 0755 "$tmp"
mv -f "$tmp" "$OUT" # atomic: a running sbatch never loads a half-written file
trap - EXIT

line="optional $OUT"
if [[ -n $PLUGSTACK ]]; then
    install -d "$(dirname "$PLUGSTACK")"
    printf '# slurm-elastic: the --elastic option (scripts/build-spank.sh)\n%s\n' "$line" \
        >"$PLUGSTACK"
    echo "build-spank: wrote $PLUGSTACK; slurm.conf needs: PlugStackConfig=$PLUGSTACK"
else
    echo "build-spank: add to plugstack.conf: $line"
    echo "build-spank: and, unless slurm.conf names one: PlugStackConfig=<that plugstack.conf>"
fi
echo "build-spank: built for Slurm $version: $OUT"
