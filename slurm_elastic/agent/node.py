"""What ``srun`` runs on every node: ``python -m slurm_elastic.agent.node <job_dir> <role>``.

It turns the job's ``launch.json`` into this node's torchrun command and ``exec``s it, so the
task Slurm tracks *is* the torch elastic agent (in the torchft mode: the node's replica
group, ``agent.replicas``, which joins the lighthouse named in ``launch.json``):

* SIGUSR1 is ignored before the exec (the ``trap '' USR1`` of SLURM-FACTS.md): torchrun does
  not handle it and dies silently on it, orphaning its workers.  The ignore is inherited
  across exec; the training library installs its own handler in the workers.
* ``is_host=1`` only for the parent job's batch host.  Fake nodes all share one host name and
  127.0.0.1, so the node is told apart by ``$SLURMD_NODENAME``, never by its address.
* ``--local-addr`` is the node's ``NodeAddr`` from Slurm, so worker traffic goes where Slurm
  says the node is (127.0.0.1 for the local fake nodes), and gloo is pinned to the loopback
  interface when that address is a loopback one.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
from pathlib import Path

from slurm_elastic.agent.jobdir import LaunchInfo
from slurm_elastic.agent.modes import (
    ADVERTISE_ENV,
    FALLBACK_ENV,
    LIGHTHOUSE_ENV,
    LIGHTHOUSE_EPOCH_ENV,
    MODE_ENV,
    REPLICA_ENV,
    TIMEOUT_ENV,
    TORCHFT,
)
from slurm_elastic.agent.rendezvous import replica_group_argv, torchrun_argv

PARENT = "parent"
COMPANION = "companion"
# What torchrun sets for its workers.
TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def node_addr(node: str) -> str | None:
    """``NodeAddr`` of ``node`` per ``scontrol``; None when Slurm cannot say."""
    try:
        out = subprocess.run(
            ["scontrol", "-o", "show", "node", node],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for word in out.split():
        if word.startswith("NodeAddr="):
            return word.partition("=")[2] or None
    return None


def is_loopback(addr: str | None) -> bool:
    try:
        return addr is not None and ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


# torchft's Rust side reads RUST_LOG as one level word (src/lib.rs, setup_logging).
_MORE_THAN_WARN = ("info", "debug", "trace")


def rust_log(asked: str | None) -> str:
    """torchft's log level for the job's groups: ``warn`` (at ``info`` it logs every quorum)
    unless the job asked for more.  Never less: the launcher counts the line a manager
    writes at ``warn`` before a kill request ends it (``agent.srunlog``)."""
    level = (asked or "").strip().lower()
    return level if level in _MORE_THAN_WARN else "warn"


def node_env(
    info: LaunchInfo, addr: str | None, env: dict[str, str], node: str = ""
) -> dict[str, str]:
    """Environment of the torch agent and its workers on this node."""
    out = dict(env)
    if info.mode == TORCHFT:
        out[MODE_ENV] = TORCHFT
        out[LIGHTHOUSE_ENV] = info.lighthouse
        out[REPLICA_ENV] = node
        out[ADVERTISE_ENV] = addr or node
        out[TIMEOUT_ENV] = str(info.ft_timeout_s)
        out[LIGHTHOUSE_EPOCH_ENV] = str(info.lighthouse_epoch)
        out["RUST_LOG"] = rust_log(out.get("RUST_LOG"))
        if info.nproc_per_node == 1:
            # The script runs without torchrun (rendezvous.replica_group_argv): nothing of a
            # torchrun's may reach it from the batch script's environment (a MASTER_PORT set
            # there would be every node's), so it starts as a one-process group of its own.
            for name in TORCHRUN_VARIABLES:
                out.pop(name, None)
    if info.fallback:
        out[FALLBACK_ENV] = info.fallback  # the workers' reports say why (status shows it)
    out["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    out["SLURM_ELASTIC_JOB_ID"] = str(info.job_id)
    out["SLURM_ELASTIC_JOB_DIR"] = info.job_dir
    out["SLURM_ELASTIC_API"] = info.api
    # The largest world the job can reach: agent.elastic's sampler keeps its steps the same
    # whatever sizes the job passes through.
    out["SLURM_ELASTIC_MAX_WORLD"] = str(info.max_nodes * info.nproc_per_node)
    # The signal contract, carried out by the torchrun wrapper (agent.stopping).
    out["SLURM_ELASTIC_STOP_SIGNAL"] = info.stop_signal
    out["SLURM_ELASTIC_STOP_GRACE"] = str(info.stop_grace_s)
    out.setdefault("OMP_NUM_THREADS", "1")
    if is_loopback(addr):
        out.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[1] not in (PARENT, COMPANION):
        print("usage: python -m slurm_elastic.agent.node JOB_DIR parent|companion", file=sys.stderr)
        return 2
    info = LaunchInfo.load(Path(args[0]))
    me = os.environ.get("SLURMD_NODENAME", "")
    is_host = args[1] == PARENT and me == info.batch_host
    addr = node_addr(me) if me else None
    if info.mode == TORCHFT:
        command = replica_group_argv(info, python=sys.executable)
    else:
        command = torchrun_argv(info, python=sys.executable, is_host=is_host, local_addr=addr)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    print(
        f"slurm-elastic node {me or '?'}: mode={info.mode} is_host={int(is_host)} addr={addr}",
        file=sys.stderr,
    )
    os.execvpe(command[0], command, node_env(info, addr, dict(os.environ), me))


if __name__ == "__main__":
    sys.exit(main())
