#!/usr/bin/env bash
# Install what slurm-elastic, its tests and its local cluster need, on Debian 12 as root.
# Idempotent and quick when everything is present (no apt-get update, no pip run):
#
#   * Debian packages: Slurm 22.05 (slurmctld, slurmd, slurmdbd, client, libslurm-dev),
#     munge, MariaDB; gcc and libc6-dev (pyslurm's Cython build); liblua5.1-0 (Debian's
#     job_submit_lua.so embeds Lua 5.1, for etc/job_submit.lua); lua5.1 (runs etc/job_submit.lua stand-alone in the tests);
#     systemd (`systemd-analyze verify` of the shipped unit; never started on this machine);
#     systemd-container (systemd-nspawn: tests/test_service_under_systemd.py boots a
#     container with systemd as PID 1 and runs the unit there, scripts/systemd-container.sh);
#     debootstrap (scripts/cluster.sh builds the Slurm 24.11 and 26.05 roots with it).
#   * two unprivileged test users, se-alice and se-bob (the hostile-user tests);
#   * torch==2.13.0 (exactly this spec: a local CPU wheel) for the job side;
#   * this package, editable, with its test, agent, torchft and plot extras (torchft after
#     torch: it keeps the CPU wheel);
#   * pyslurm 22.5 built against the host's Slurm 22.05 (scripts/build-pyslurm.sh; ~4 min the
#     first time, skipped when /var/lib/slurm-elastic/pyslurm/22.05 holds the build).
#
# PYTHON selects the interpreter (default python3).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
PACKAGES=(slurmctld slurmd slurm-client slurmdbd libslurm-dev munge mariadb-server
    liblua5.1-0 lua5.1 systemd systemd-container debootstrap gcc libc6-dev)
TORCH_SPEC="torch==2.13.0"

say() { echo "install-deps: $*"; }

[[ $(id -u) -eq 0 ]] || {
    echo "install-deps: must run as root (apt-get, system daemons)" >&2
    exit 1
}

# ------------------------------------------------------------------ Debian packages
missing=()
for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || missing+=("$pkg")
done
if ((${#missing[@]})); then
    say "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # No daemon may start from a package script: cluster.sh starts them, on loopback only.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    say "Debian packages present"
fi

# ------------------------------------------------------------------ Python
if "$PYTHON" - "$TORCH_SPEC" <<'EOF'; then
import sys
from importlib.metadata import PackageNotFoundError, version

want = sys.argv[1].split("==")[1]
try:
    have = version("torch")
except PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if have.split("+")[0] == want else 1)
EOF
    say "$TORCH_SPEC present"
else
    say "installing $TORCH_SPEC"
    "$PYTHON" -m pip install -q "$TORCH_SPEC"
fi

# Editable install of this checkout with its extras, unless that is exactly what is there:
# slurm-elastic installed editable from this directory, and every requirement that
# pyproject.toml names *now* (a dependency added since the last install counts) satisfied.
if "$PYTHON" -P - "$PWD" <<'EOF'; then
import json
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution, version

try:
    from packaging.requirements import Requirement
except ImportError:  # not installed on a fresh machine; pip always carries a copy
    from pip._vendor.packaging.requirements import Requirement

try:
    dist = distribution("slurm-elastic")
except PackageNotFoundError:
    sys.exit(1)
if json.loads(dist.read_text("direct_url.json") or "{}").get("url") != f"file://{sys.argv[1]}":
    sys.exit(1)
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project.get("optional-dependencies", {})
extra_names = ("test", "agent", "torchft", "plot")
wanted = [project["dependencies"], *(extras.get(name, []) for name in extra_names)]
for text in (req for group in wanted for req in group):
    req = Requirement(text)
    try:
        if not req.specifier.contains(version(req.name), prereleases=True):
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
EOF
    say "slurm-elastic (editable, test+agent+torchft+plot extras) present"
else
    say "installing slurm-elastic (editable) with extras test, agent, torchft, plot"
    "$PYTHON" -m pip install -q -e '.[test,agent,torchft,plot]'
fi

# ------------------------------------------------------------------ test users
# Two unprivileged users for the hostile-user tests (tests/slurm_cluster.py: two_users):
# jobs of one must never move the daemon against the other's.  Their homes are under
# /home, which every version's root binds, and cluster.sh gives them Slurm associations.
for user in se-alice se-bob; do
    if ! id -u "$user" >/dev/null 2>&1; then
        say "adding test user $user"
        useradd --create-home --user-group --shell /bin/bash "$user"
    fi
done

# ------------------------------------------------------------------ pyslurm
# Not on PyPI for 22.05: built from ../shared/vendor into its own directory (never
# site-packages), which the daemon and the tests find via slurm.select.pyslurm_dir.
PYTHON="$PYTHON" bash scripts/build-pyslurm.sh --slurm 22.05
