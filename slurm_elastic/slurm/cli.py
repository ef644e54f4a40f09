"""``CliBackend``: the default SlurmBackend, built on Slurm's own client commands.

Reads (fixed cost whatever the job count; see ``scripts/bench_slurm_read.py``):

* ``read_cluster`` = ``squeue --json`` + ``sinfo --json`` + ``scontrol -o show
  partition``: exactly three calls.  ``squeue --json`` ignores filters in 22.05,
  so it always returns every job (including ones that ended within MinJobAge);
  callers filter client-side.
* ``read_history`` = one ``sacct`` call (``-P`` text by default: ~4x cheaper than
  ``--json`` on 22.05, which costs ~0.36 s even for one job).

Actions go through ``SlurmRunner.act`` (dry-run aware).  Only idempotent ones
(pin, shrink, admin comment, cancel, reconfigure) are retried, and only when Slurm was
unreachable (nothing was applied then); signal, requeue and submit are never
repeated automatically because a second try could act twice.

Heterogeneous jobs are read one JobView per component (raw id, ``het_job_id``,
``het_job_offset``); the daemon treats them as rigid and never resizes them.
"""

from __future__ import annotations

import os
import pwd
import re
import time
from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

import hostlist
import structlog
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from slurm_elastic.errors import (
    ActionRefused,
    SlurmParseError,
    SlurmRejected,
    SlurmUnreachable,
)
from slurm_elastic.slurm import parse_json, parse_text
from slurm_elastic.slurm.runner import SlurmRunner
from slurm_elastic.types import (
    Capabilities,
    ClusterSnapshot,
    JobHistory,
    JobState,
    JobView,
    NodeView,
    PartitionView,
)

log = structlog.get_logger(__name__)

T = TypeVar("T")

_SIGNAL = re.compile(r"^(?:SIG)?[A-Z][A-Z0-9+-]*$|^\d{1,2}$")
_VERSION = re.compile(r"(\d+\.\d+\.\d+)")
_USER = re.compile(r"^[a-z_][a-z0-9_.-]*\$?$", re.IGNORECASE)
_SACCT_TEXT = (
    "sacct", "-a", "-X", "-D", "-P", "-n", "--noconvert",
    "-o", ",".join(parse_text.SACCT_FIELDS),
)  # fmt: skip
_SQUEUE_TEXT = ("squeue", "-h", "-a", "-t", "all", "-o", parse_text.SQUEUE_FORMAT)


# Slurm versions with the node leak after a shrink.  Measured on 22.05.8 (the local
# cluster, OverSubscribe=EXCLUSIVE partition): job A shrunk with ``scontrol update
# NumNodes=``, job B started on the nodes A gave back, A ended, then B ended: one of B's
# nodes no longer takes exclusive jobs (Reason=Resources, slurmctld debug "Requested nodes
# are busy") although sinfo shows it idle, until ``scontrol reconfigure``; a reconfigure
# after A ended (B still running) prevents it.  Other versions are not assumed affected.
SHRINK_LEAK_VERSIONS = ("22.05.",)


def leaks_nodes_after_shrink(version: str) -> bool:
    """Whether Slurm ``version`` ("22.05.8") has the node leak described above."""
    return version.startswith(SHRINK_LEAK_VERSIONS)


def _slurm_time(epoch_s: float) -> str:
    # sacct -S/-E read local time, like the timestamps it prints.
    return datetime.fromtimestamp(epoch_s).strftime("%Y-%m-%dT%H:%M:%S")


class CliBackend:
    """SlurmBackend over ``squeue``/``sinfo``/``scontrol``/``sacct``/``sbatch``/``scancel``."""

    def __init__(
        self,
        runner: SlurmRunner | None = None,
        *,
        slurm_conf: str | None = None,
        timeout_s: float = 30.0,
        dry_run: bool = False,
        history_format: str = "text",
        job_format: str = "json",
        action_attempts: int = 3,
        retry_wait_s: float = 0.5,
    ) -> None:
        if history_format not in {"text", "json"}:
            raise ValueError(f"history_format must be 'text' or 'json', not {history_format!r}")
        if job_format not in {"text", "json"}:
            raise ValueError(f"job_format must be 'text' or 'json', not {job_format!r}")
        self.runner = runner or SlurmRunner(
            slurm_conf=slurm_conf, timeout_s=timeout_s, dry_run=dry_run
        )
        self.history_format = history_format
        self.job_format = job_format
        self._retry = retry(
            retry=retry_if_exception_type(SlurmUnreachable),
            stop=stop_after_attempt(max(1, action_attempts)),
            wait=wait_exponential(multiplier=retry_wait_s, max=retry_wait_s * 8),
            reraise=True,
        )

    # ------------------------------------------------------------------ reads

    def read_cluster(self, now: float | None = None) -> ClusterSnapshot:
        before = self.runner.calls
        jobs = self.read_jobs()
        nodes = self.read_nodes()
        partitions = self.read_partitions()
        return ClusterSnapshot(
            taken_at=time.time() if now is None else now,
            jobs=jobs,
            nodes=nodes,
            partitions=partitions,
            slurm_calls=self.runner.calls - before,
        )

    def read_jobs(self) -> tuple[JobView, ...]:
        if self.job_format == "text":
            # The text path misses max_nodes/admin_comment/gpus (no -o letters for them).
            return parse_text.parse_squeue_text(self.runner.read(_SQUEUE_TEXT).stdout)
        return parse_json.squeue(self.runner.read(("squeue", "--json")).stdout)

    def read_nodes(self) -> tuple[NodeView, ...]:
        return parse_json.sinfo(self.runner.read(("sinfo", "--json")).stdout)

    def read_partitions(self) -> tuple[PartitionView, ...]:
        out = self.runner.read(("scontrol", "-o", "show", "partition")).stdout
        return parse_text.parse_scontrol_partitions(out)

    def read_history(self, since: float, until: float | None = None) -> tuple[JobHistory, ...]:
        window = ["-S", _slurm_time(since)]
        if until is not None:
            window += ["-E", _slurm_time(until)]
        if self.history_format == "json":
            out = self.runner.read(("sacct", "-a", "--json", *window)).stdout
            return parse_json.sacct(out)
        out = self.runner.read((*_SACCT_TEXT, *window)).stdout
        return parse_text.parse_sacct_text(out)

    def read_job(self, job_id: int) -> JobView | None:
        """One job via ``scontrol -o show job`` (action pre-checks only, never per cycle).

        Counted in ``runner.read_calls`` like every read; a cycle's observe cost is
        ``ClusterSnapshot.slurm_calls`` (always 3)."""
        try:
            out = self.runner.read(("scontrol", "-o", "show", "job", str(job_id))).stdout
        except SlurmRejected as exc:
            if "invalid job id" in exc.slurm_message.lower():
                return None
            raise
        views = [v for v in parse_text.parse_scontrol_jobs(out) if v.job_id == job_id]
        return views[0] if views else None

    def slurm_version(self) -> str:
        """The running Slurm's version ("22.05.8") from ``scontrol --version``: one call."""
        version_out = self.runner.read(("scontrol", "--version")).stdout
        match = _VERSION.search(version_out)
        if match is None:
            raise SlurmParseError(f"scontrol --version: no version in {version_out.strip()!r}")
        return match.group(1)

    def probe(self) -> Capabilities:
        version = self.slurm_version()
        config = parse_text.parse_scontrol_config(
            self.runner.read(("scontrol", "show", "config")).stdout
        )
        try:
            doc = parse_json.decode(self.runner.read(("sinfo", "--json")).stdout, "sinfo --json")
            plugin: str | None = parse_json.plugin_type(doc, "sinfo --json")
        except (SlurmRejected, SlurmParseError):
            plugin = None  # no --json in this Slurm (or no serializer plugin installed)
        scheduler = config.get("SchedulerParameters", "")
        return Capabilities(
            version=version,
            json_plugin=plugin,
            permit_job_expansion="permit_job_expansion" in scheduler.split(","),
            multiple_slurmd=config.get("MULTIPLE_SLURMD", "").lower() == "yes",
            leaks_nodes_after_shrink=leaks_nodes_after_shrink(version),
        )

    # ------------------------------------------------------------------ actions

    def pin_pending_size(self, job_id: int, nodes: int) -> None:
        _positive(job_id, "job id")
        _positive(nodes, "node count")
        self._require_state(job_id, JobState.PENDING, "pin the size of")
        self._idempotent(
            lambda: self.runner.act(
                ("scontrol", "update", f"JobId={job_id}", f"NumNodes={nodes}-{nodes}")
            )
        )
        log.info("slurm.pin_pending_size", job_id=job_id, nodes=nodes)

    def shrink(self, job_id: int, nodes: int) -> None:
        _positive(job_id, "job id")
        _positive(nodes, "node count")
        job = self._require_state(job_id, JobState.RUNNING, "shrink")
        if nodes >= len(job.nodes):
            raise ActionRefused(
                f"job {job_id} holds {len(job.nodes)} node(s); shrinking to {nodes} is not a shrink"
            )
        keep = _keep_nodes(job, nodes)
        if list(keep) == list(job.nodes[:nodes]):
            change = f"NumNodes={nodes}"  # Slurm keeps the first n nodes, batch host among them
        else:
            change = f"NodeList={hostlist.collect_hostlist(list(keep))}"
        self._idempotent(lambda: self.runner.act(("scontrol", "update", f"JobId={job_id}", change)))
        log.info("slurm.shrink", job_id=job_id, nodes=nodes, keep=",".join(keep))

    def signal(self, job_id: int, signal: str, *, batch_only: bool) -> None:
        _positive(job_id, "job id")
        name = signal.strip().upper()
        if not _SIGNAL.match(name):
            raise ActionRefused(f"not a signal name: {signal!r}")
        argv = ["scancel", f"--signal={name.removeprefix('SIG')}"]
        if batch_only:
            argv.append("--batch")
        self.runner.act((*argv, str(job_id)))
        log.info("slurm.signal", job_id=job_id, signal=name, batch_only=batch_only)

    def set_admin_comment(self, job_id: int, text: str) -> None:
        _positive(job_id, "job id")
        if "\n" in text or "\r" in text:
            raise ActionRefused("an admin comment must be one line")
        self._idempotent(
            lambda: self.runner.act(
                ("scontrol", "update", f"JobId={job_id}", f"AdminComment={text}")
            )
        )
        log.info("slurm.set_admin_comment", job_id=job_id, text=text)

    def requeue(self, job_id: int) -> None:
        _positive(job_id, "job id")
        self.runner.act(("scontrol", "requeue", str(job_id)))
        log.info("slurm.requeue", job_id=job_id)

    def cancel(self, job_id: int) -> None:
        _positive(job_id, "job id")
        self._idempotent(lambda: self.runner.act(("scancel", str(job_id))))
        log.info("slurm.cancel", job_id=job_id)

    def reconfigure(self) -> None:
        """``scontrol reconfigure`` (root or SlurmUser only; refused otherwise).

        Idempotent, so retried when slurmctld was unreachable; the daemon issues it after a
        job it shrank has ended, on versions in ``SHRINK_LEAK_VERSIONS``.
        """
        self._idempotent(lambda: self.runner.act(("scontrol", "reconfigure")))
        log.info("slurm.reconfigure")

    def submit(
        self,
        script: str,
        *,
        user: str,
        nodes: int,
        partition: str,
        account: str | None = None,
        qos: str | None = None,
        name: str | None = None,
        comment: str | None = None,
        work_dir: str | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> int:
        _positive(nodes, "node count")
        if not script.startswith("#!"):
            raise ActionRefused("a batch script must start with '#!'")
        prefix = self._as_user(user)
        if work_dir is None:
            work_dir = pwd.getpwnam(user).pw_dir
        argv = ["sbatch", "--parsable", f"--nodes={nodes}", f"--partition={partition}"]
        argv.append(f"--chdir={work_dir}")
        for flag, value in (("account", account), ("qos", qos), ("job-name", name)):
            if value:
                argv.append(f"--{flag}={value}")
        if comment is not None:
            argv.append(f"--comment={comment}")
        argv.extend(extra_args)
        result = self.runner.act((*prefix, *argv), stdin=script)
        if result.dry_run:
            log.info("slurm.submit", user=user, dry_run=True)
            return 0
        first = result.stdout.strip().split(";", 1)[0]
        if not first.isdigit():
            raise SlurmParseError(f"sbatch --parsable: no job id in {result.stdout.strip()!r}")
        job_id = int(first)
        log.info("slurm.submit", job_id=job_id, user=user, nodes=nodes, partition=partition)
        return job_id

    # ------------------------------------------------------------------ helpers

    def _idempotent(self, action: Callable[[], T]) -> T:
        result: T = self._retry(action)()
        return result

    def _require_state(self, job_id: int, state: JobState, verb: str) -> JobView:
        job = self.read_job(job_id)
        if job is None:
            raise ActionRefused(f"cannot {verb} job {job_id}: no such job")
        if job.state is not state:
            raise ActionRefused(f"cannot {verb} job {job_id}: it is {job.state}, not {state}")
        return job

    def _as_user(self, user: str) -> tuple[str, ...]:
        """Command prefix that runs sbatch as ``user``: user code never runs as root."""
        if not _USER.match(user):
            raise ActionRefused(f"not a user name: {user!r}")
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise ActionRefused(f"no such user: {user!r}") from None
        if entry.pw_uid == os.geteuid():
            return ()
        if os.geteuid() != 0:
            raise ActionRefused(f"only root can submit as another user ({user!r})")
        return ("runuser", "-u", user, "--")


def _positive(value: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ActionRefused(f"{what} must be a positive integer, got {value!r}")


def _keep_nodes(job: JobView, nodes: int) -> tuple[str, ...]:
    """The first ``nodes`` nodes, always including the batch host (never removed)."""
    if job.batch_host is None or job.batch_host in job.nodes[:nodes]:
        return job.nodes[:nodes]
    others = [n for n in job.nodes if n != job.batch_host]
    return (job.batch_host, *others[: nodes - 1])
