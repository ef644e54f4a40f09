"""The job directory ``<WorkDir>/.slurm-elastic/job-<id>/`` and the files in it.

``WorkDir`` is the parent job's working directory as Slurm records it: the submit directory
(``$SLURM_SUBMIT_DIR``) unless the job was submitted with ``--chdir``.  Slurm's record, not
the environment, because a companion job is submitted by the daemon from elsewhere: its own
``$SLURM_SUBMIT_DIR`` is the daemon's, while the parent's ``WorkDir`` is what both agree on.

It is the only channel between the launcher (batch host), the workers on every node, and
companion jobs, so it must live on a file system every node sees (the submit directory
normally is).  Every file is written atomically (temporary + rename) and read whole, and
only through ``agent.owndir``: from ``.slurm-elastic`` down, every directory and file must
be this user's alone (made 0700, opened without following links, checked by descriptor),
so another user sharing the work directory cannot plant what the job executes or obeys:

* ``launch.json``  what a companion needs to join: argv, mode, rendezvous endpoint and id
  (in the torchft mode the lighthouse's address), sizes.
* ``environment.json`` the parent batch script's environment (what its ``export`` lines and
  ``module load`` / venv activation made), less what belongs to one job, node or process
  (:func:`job_local`): a companion's workers run in it, as the parent's do, not in the
  owner's login environment the companion starts from.  Mode 0600: it may hold secrets.
* ``control.json`` launcher -> workers: ``hold`` (checkpoint at the next step boundary and
  wait), ``resume`` (continue, or exit so torch elastic re-forms the group at a new size),
  ``checkpoint`` (save soon, keep training).  ``seq`` increases with every new request.
* ``held.json``    workers -> launcher: rank 0 says all ranks stopped at ``step`` for ``seq``.
* ``left-<node>.json`` workers -> launcher (torchft mode): the node's replica group left the
  quorum on ``leave`` request ``seq`` after ``step``.
* ``done.json``    rank 0 says training finished (so a non-zero srun status after a shrink,
  whose killed tasks Slurm counts, is not mistaken for a failure).
* ``checkpoints/`` the training checkpoints (see ``agent.checkpoint``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog

from slurm_elastic.agent.modes import DEFAULT_FT_TIMEOUT_S, MODES, TORCHRUN
from slurm_elastic.agent.owndir import OwnDir
from slurm_elastic.errors import AgentError

LAUNCH = "launch.json"
ENVIRONMENT = "environment.json"
CONTROL = "control.json"
HELD = "held.json"
DONE = "done.json"
RELEASE = "release.json"  # companions a shrink gives back (agent.stopping)
CHECKPOINTS = "checkpoints"

log = structlog.get_logger("slurm_elastic.agent")


# Variables of one job, node or process: a companion keeps its own (Slurm's job and step
# variables, the GPUs Slurm bound, the launcher's and MPI's per-process ones).
_JOB_LOCAL_PREFIXES = ("SLURM_", "SLURMD_", "TORCHELASTIC_", "PMI_", "PMIX_", "OMPI_")
_JOB_LOCAL_NAMES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "ROCR_VISIBLE_DEVICES",
        "ENVIRONMENT",  # Slurm's BATCH
        "HOSTNAME",
        "TMPDIR",  # per job where Slurm's job_container/tmpfs makes one
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
    }
)


def job_local(name: str) -> bool:
    """Whether ``name`` belongs to one job, node or process (never carried to a companion).
    This tool's own ``SLURM_ELASTIC_*`` settings are the job's and carry (the node agent
    sets the per-job ones anew)."""
    if name.startswith("SLURM_ELASTIC_"):
        return False
    return name.startswith(_JOB_LOCAL_PREFIXES) or name in _JOB_LOCAL_NAMES


def save_environment(directory: Path, env: Mapping[str, str]) -> Path:
    """Write the parent's environment for its companions (``environment.json``, mode 0600)."""
    carried = {name: value for name, value in env.items() if not job_local(name)}
    payload = (json.dumps(carried, indent=1, sort_keys=True) + "\n").encode()

    return OwnDir(directory).write(ENVIRONMENT, lambda handle: handle.write(payload))


def companion_environment(own: Mapping[str, str], directory: Path) -> dict[str, str]:
    """A companion's environment for its workers: the parent's (``environment.json``) over
    ``own``, except the names that are the companion's own (:func:`job_local`).  Without
    the file (a parent from an older version) ``own`` alone."""
    env = dict(own)
    for name, value in _own_private_json(directory / ENVIRONMENT).items():
        if isinstance(value, str) and not job_local(name):
            env[name] = value
    return env


def _own_private_json(path: Path) -> dict[str, Any]:
    """The file's object when this user owns it and nobody else may write it (``OwnDir``);
    {} without the file.  An environment planted by another user (a shared work directory)
    must not reach the workers (LD_PRELOAD, PATH): refused, with the reason."""
    raw = OwnDir(path.parent).read(path.name)
    return {} if raw is None else _json_object(raw, path)


def job_dir(work_dir: str | Path, job_id: int) -> Path:
    return Path(work_dir) / ".slurm-elastic" / f"job-{job_id}"


def write_json(path: Path, data: dict[str, Any]) -> None:
    payload = (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()
    OwnDir(path.parent).write(path.name, lambda handle: handle.write(payload))


def read_json(path: Path) -> dict[str, Any] | None:
    """The file's object, or None when it does not exist yet (read through ``OwnDir``)."""
    raw = OwnDir(path.parent).read(path.name)
    return None if raw is None else _json_object(raw, path)


def _json_object(raw: bytes, path: Path) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        raise AgentError(f"{path} is not valid JSON") from None
    if not isinstance(value, dict):
        raise AgentError(f"{path} does not hold a JSON object")
    return value


@dataclass(frozen=True, slots=True)
class LaunchInfo:
    """``launch.json``: everything a node agent or a companion job needs to join."""

    job_id: int
    argv: tuple[str, ...]
    nproc_per_node: int
    rdzv_host: str
    rdzv_port: int
    rdzv_id: str
    min_nodes: int
    max_nodes: int
    batch_host: str
    max_restarts: int
    api: str
    job_dir: str
    created_at: float
    rdzv_conf: dict[str, str] = field(default_factory=dict)
    stop_signal: str = "USR1"  # the signal contract (agent.stopping)
    stop_grace_s: float = 30.0
    mode: str = TORCHRUN  # agent.modes; in the torchft mode rdzv_* is the lighthouse's
    ft_timeout_s: float = DEFAULT_FT_TIMEOUT_S
    lighthouse_epoch: int = 0  # the torchft mode: how many lighthouses died before this one
    # Why a job launched in the torchft mode runs in the restart mode now ("" if it does
    # not): ``agent.modes.FALLBACK_OUTSIDE_KILLS``.
    fallback: str = ""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise AgentError(f"launch.json names an unknown mode {self.mode!r}")

    @property
    def rdzv_endpoint(self) -> str:
        return f"{self.rdzv_host}:{self.rdzv_port}"

    @property
    def lighthouse(self) -> str:
        """The torchft lighthouse's address (the torchft mode)."""
        return f"http://{self.rdzv_endpoint}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["argv"] = list(self.argv)
        data["rdzv_endpoint"] = self.rdzv_endpoint
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchInfo:
        try:
            return cls(
                job_id=int(data["job_id"]),
                argv=tuple(str(a) for a in data["argv"]),
                nproc_per_node=int(data["nproc_per_node"]),
                rdzv_host=str(data["rdzv_host"]),
                rdzv_port=int(data["rdzv_port"]),
                rdzv_id=str(data["rdzv_id"]),
                min_nodes=int(data["min_nodes"]),
                max_nodes=int(data["max_nodes"]),
                batch_host=str(data["batch_host"]),
                max_restarts=int(data["max_restarts"]),
                api=str(data["api"]),
                job_dir=str(data["job_dir"]),
                created_at=float(data["created_at"]),
                rdzv_conf={str(k): str(v) for k, v in data.get("rdzv_conf", {}).items()},
                stop_signal=str(data.get("stop_signal", "USR1")),
                stop_grace_s=float(data.get("stop_grace_s", 30.0)),
                mode=str(data.get("mode", TORCHRUN)),
                ft_timeout_s=float(data.get("ft_timeout_s", DEFAULT_FT_TIMEOUT_S)),
                lighthouse_epoch=int(data.get("lighthouse_epoch", 0)),
                fallback=str(data.get("fallback", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise AgentError(f"launch.json is incomplete or malformed: {exc}") from None

    def save(self) -> Path:
        path = Path(self.job_dir) / LAUNCH
        write_json(path, self.to_json())
        return path

    @classmethod
    def load(cls, directory: Path) -> LaunchInfo:
        data = read_json(directory / LAUNCH)
        if data is None:
            raise AgentError(
                f"no {LAUNCH} in {directory}: is the parent job running slurm-elastic run, "
                "and is this the parent's working directory?"
            )
        return cls.from_json(data)


@dataclass(frozen=True, slots=True)
class Control:
    """``control.json``: the launcher's latest request to the workers."""

    seq: int
    action: str  # "hold" | "resume" | "checkpoint"
    restart: bool = False  # resume: exit so that torch elastic re-forms the group
    instruction_id: str = ""
    keep_nodes: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Control:
        return cls(
            seq=int(data["seq"]),
            action=str(data["action"]),
            restart=bool(data.get("restart", False)),
            instruction_id=str(data.get("instruction_id", "")),
            keep_nodes=tuple(data.get("keep_nodes", ())),
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["keep_nodes"] = list(self.keep_nodes)
        return data


class ControlReader:
    """Cheap per-step check of ``control.json``: one ``stat``, a read only when it changed."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / CONTROL
        self._dir = OwnDir(directory)
        self._stamp: tuple[int, int] | None = None
        self._last: Control | None = None

    def read(self) -> Control | None:
        st = self._dir.stat(CONTROL)
        if st is None:
            return None
        stamp = (st.st_mtime_ns, st.st_ino)
        if stamp != self._stamp:
            data = read_json(self.path)
            self._last = Control.from_json(data) if data is not None else None
            self._stamp = stamp
        return self._last
