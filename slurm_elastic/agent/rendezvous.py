"""The torchrun command line and the rendezvous port: pure functions, no torch import.

Settings that companion growth needs (measured in SLURM-FACTS.md, torch 2.13):

* ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` on every agent of parent and companions: with the
  shared store the old rank 0 never republishes MASTER_ADDR for a new round and growth
  deadlocks.
* ``is_host=1`` only on the parent's batch host agent (Slurm never removes the batch host),
  ``is_host=0`` everywhere else: otherwise whichever agent binds first hosts the c10d store
  and the job dies when that node is shrunk away.
* ``last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3``: the defaults (30 s
  last call, 5 s x 3 keep-alive) put 40-50 s into every resize.  SLURM-FACTS measured 3 s;
  2 s saved ~1 s per shrink here while still letting the first round gather every node of
  a job whose ``srun`` tasks start a second apart on a loaded machine (1 s saved 2 s but
  risks a first round short of nodes, i.e. an extra restart).  ``--rdzv-conf`` overrides.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Sequence

from slurm_elastic.agent.jobdir import LaunchInfo

FAST_RDZV_CONF: dict[str, str] = {
    "last_call_timeout": "2",
    "keep_alive_interval": "1",
    "keep_alive_max_attempt": "3",
}
PORT_BASE = 20000  # below Linux's ephemeral range (32768-60999), above the well-known ports
PORT_SPAN = 12000
_PYTHONS = ("python", "python3")


def choose_port(host: str, *, tries: int = 64) -> int:
    """A port ``host`` can bind right now, drawn at random (``secrets``) from the window.

    Never derived from the job id or anything else another user can read: the rendezvous
    store (torchrun) and the lighthouse (torchft) accept any client that finds them, so
    their port is written only where the job owner alone reads it (``launch.json``, mode
    0600 in the owner's 0700 job directory).  It is no secret from a port scan of the batch
    host: docs/security.md says what that still allows."""
    port = PORT_BASE + secrets.randbelow(PORT_SPAN)
    for _ in range(tries):
        if _can_bind(host, port):
            return port
        port = PORT_BASE + secrets.randbelow(PORT_SPAN)
    return port


def _can_bind(host: str, port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def parse_conf(text: str) -> dict[str, str]:
    """``k=v,k=v`` (torchrun's --rdzv-conf syntax) -> dict; ValueError on a bad item."""
    conf: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"rendezvous setting {item!r} is not key=value")
        if key.strip() == "is_host":
            raise ValueError("is_host is set per node by slurm-elastic run")
        conf[key.strip()] = value.strip()
    return conf


def rdzv_conf(info: LaunchInfo, *, is_host: bool) -> str:
    conf = {"is_host": "1" if is_host else "0", **FAST_RDZV_CONF, **info.rdzv_conf}
    return ",".join(f"{key}={value}" for key, value in conf.items())


def script_args(argv: Sequence[str]) -> list[str]:
    """torchrun's view of the user's command: it runs Python scripts itself.

    ``python train.py ...`` -> ``train.py ...``; ``python -m pkg ...`` -> ``-m pkg ...``;
    anything else (a shell wrapper, a binary) -> ``--no-python cmd ...``.
    """
    if not argv:
        return []
    head = os.path.basename(argv[0])
    if head in _PYTHONS or head.startswith("python3."):
        rest = list(argv[1:])
        if rest[:1] == ["-m"] and len(rest) > 1:
            return ["--module", *rest[1:]]
        if rest and not rest[0].startswith("-"):
            return rest
    return ["--no-python", *argv]


def replica_group_argv(info: LaunchInfo, *, python: str) -> list[str]:
    """The torchft mode's command for one node: one replica group.

    One process per node runs the script itself: a torchrun around it would cost a second
    Python and ``import torch`` before a new group can join (seconds on a loaded node), and
    its process group is then a one-process one (``agent.boundary``).  Several processes
    run under a torchrun of their own (``--standalone``: the group's store on this node),
    never restarted by it: a group that fails leaves the quorum and the others go on.
    """
    script = script_args(info.argv)
    if info.nproc_per_node == 1:
        if script[:1] == ["--no-python"]:
            return script[1:]
        if script[:1] == ["--module"]:
            return [python, "-m", *script[1:]]
        return [python, *script]
    argv = [
        python,
        "-m",
        "slurm_elastic.agent.torchrun",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={info.nproc_per_node}",
        "--max-restarts=0",
    ]
    return argv + script


def torchrun_argv(
    info: LaunchInfo, *, python: str, is_host: bool, local_addr: str | None
) -> list[str]:
    """The full torchrun command for one node: ``python -m slurm_elastic.agent.torchrun``
    (torch.distributed.run without the error lines of a planned resize) and its options."""
    argv = [
        python,
        "-m",
        "slurm_elastic.agent.torchrun",
        f"--nnodes={info.min_nodes}:{info.max_nodes}",
        f"--nproc-per-node={info.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={info.rdzv_endpoint}",
        f"--rdzv-id={info.rdzv_id}",
        f"--rdzv-conf={rdzv_conf(info, is_host=is_host)}",
        f"--max-restarts={info.max_restarts}",
    ]
    if local_addr:
        argv.append(f"--local-addr={local_addr}")
    return argv + script_args(info.argv)
