"""How often Slurm's node leak after a shrink happens, with and without the daemon's fix.

The scenario of ``tests/test_daemon_live.py::shrink_reuse_and_end``, driven through the
daemon's Controller on a local cluster instance: a 4-node elastic job is hard-shrunk to 2
(``NumNodes=2``), a rigid job takes the 2 freed nodes, the shrunk job ends (one cycle), the
rigid job ends (one cycle); then an exclusive job on every node is submitted.  "Leaked"
means it did not start within ``--wait`` seconds.  Run once per setting of
``slurm.reconfigure_after_shrink`` (``never``: no workaround; ``auto``: the daemon's
``scontrol reconfigure`` once the shrunk job has ended).  Between trials every job is
cancelled and ``scontrol reconfigure`` heals the cluster.

    python scripts/measure_shrink_leak.py --instance 3 --trials 3

Last line: ``trials=N never_leaked=K auto_leaked=M slurm=VERSION``.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from cluster_env import VERSIONS, use_cluster  # noqa: E402


def cluster_env(version: str, instance: int) -> None:
    use_cluster(version, instance)


def trial(setting: str, wait_s: float) -> bool:
    """True when the whole-cluster job did not start (the leak)."""
    from tests import test_daemon_live as live

    work = Path(tempfile.mkdtemp(prefix="shrink-leak-"))
    agent = work / "fake-agent"
    agent.write_text("#!/bin/sh\nexec sleep 600\n")
    agent.chmod(0o755)
    total = len(live.CliBackend().read_nodes())
    live.wait_for(lambda: live.idle_nodes() == total, timeout_s=60)
    try:
        live.shrink_reuse_and_end(work, setting)
        return not live.whole_cluster_job_starts(work, timeout_s=wait_s)
    finally:
        subprocess.run(["scancel", "--user=root"], check=False, timeout=30)
        time.sleep(2)
        subprocess.run(["scontrol", "reconfigure"], check=False, timeout=60)
        live.wait_for(lambda: not live.jobs(), timeout_s=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instance", type=int, default=0)
    parser.add_argument("--slurm", choices=VERSIONS, default="22.05")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--wait", type=float, default=30.0, help="seconds for the last job")
    args = parser.parse_args()
    cluster_env(args.slurm, args.instance)
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    version = subprocess.run(
        ["scontrol", "--version"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.split()[-1]
    leaked = {"never": 0, "auto": 0}
    for i in range(args.trials):
        for setting in leaked:
            hit = trial(setting, args.wait)
            leaked[setting] += hit
            print(f"trial {i + 1} {setting}: {'leaked' if hit else 'started'}", flush=True)
    print(
        f"trials={args.trials} never_leaked={leaked['never']} auto_leaked={leaked['auto']}"
        f" slurm={version}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
