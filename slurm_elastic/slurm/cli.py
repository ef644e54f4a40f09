"""``CliBackend``: the default SlurmBackend, built on Slurm's own client commands.

Reads (fixed cost whatever the job count; see ``scripts/bench_slurm_read.py``):

* ``read_cluster`` = ``squeue --json -a -t all`` + the nodes command + ``scontrol -o
  show partition``: three calls.  ``squeue --json`` ignores filters in 22.05 and
  always returns every job, including ones that ended within MinJobAge; 24.11+ honour
  ``-t`` and leave ended jobs out unless given ``-t all``, which is therefore passed on
  every version so that callers see the same jobs and filter client-side.
* Nodes: 22.05's ``sinfo --json`` lists them one by one; from 24.11 on it groups them
  by partition and state, and ``scontrol --json show nodes`` (absent in 22.05) lists
  them.  The JSON generation of the ``squeue --json`` document read just before names
  the right command (``parse_json.commands``), so a JSON read costs no extra call and
  follows a Slurm upgrade at the next cycle.  Without one (``job_format="text"``, or
  ``read_nodes`` alone) the backend reads ``sinfo --json`` once: on 22.05 that is the
  answer, on 24.11+ its generation points to scontrol, which then costs one more call,
  once; the choice is kept, and forgotten when that read fails.
* ``read_job`` (action pre-checks): ``scontrol --json show job ID`` from 24.11 on, known
  the same way; on 22.05, which has no ``--json`` there (and whose ``squeue --json``
  ignores ``-j``), ``squeue -j ID -O`` with a fresh separator.  Never ``scontrol -o show
  job``: its one-line text breaks where free text holds a newline (a comment, 26.05's
  SubmitLine), and a job's owner could make such a line read as another record.
* ``job_format="text"`` reads jobs with ``squeue -O`` (see ``parse_text``); squeue
  reports an unknown ``-O`` field on stderr but exits 0 (24.11.5), so stderr is checked.
* ``read_history`` = one ``sacct -D`` call: ``-p --delimiter=SEP`` text by default, SEP
  made fresh for the call (``parse_text.new_separator``), so a comment cannot forge a row
  as it could with ``-P``'s fixed ``|``.  At 363 jobs in the window on 22.05: 103 ms
  against 750 ms for ``--json`` (``history_format="json"``, also with ``-D``); both are
  unforgeable, and a row that does not parse is left out rather than failing the read
  (``history.records``).  ``-D`` keeps a requeued job's earlier runs (``REQUEUED``
  records), which 24.11+ drop from ``--json`` without it.

Actions go through ``SlurmRunner.act`` (dry-run aware).  Only idempotent ones
(pin, shrink, admin comment, cancel, reconfigure) are retried here, a few times within
the call, and only when Slurm was unreachable or asked to try again (``SlurmBusy``):
nothing was applied then.  Signal, requeue and submit are never repeated automatically
because a second try could act twice.  What still fails is retried on a later cycle,
with backoff, by the executor (``actuate.guards.retry_reason``).

Heterogeneous jobs are read one JobView per component (raw id, ``het_job_id``,
``het_job_offset``); the daemon treats them as rigid and never resizes them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import time
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any, TypeVar

import hostlist
import structlog
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from slurm_elastic.errors import (
    ActionRefused,
    SlurmBusy,
    SlurmError,
    SlurmParseError,
    SlurmRejected,
    SlurmUnreachable,
)
from slurm_elastic.slurm import parse_json, parse_text
from slurm_elastic.slurm.backend import check_own_partitions
from slurm_elastic.slurm.owner import SUBMIT_OPTIONS, submit_environment, submit_prefix
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
    "sacct", "-a", "-X", "-D", "-p", "-n", "--noconvert",
    "-o", ",".join(parse_text.SACCT_FIELDS),
)  # fmt: skip
_SQUEUE_TEXT = ("squeue", "-h", "-a", "-t", "all")
_SQUEUE_JSON = ("squeue", "--json", "-a", "-t", "all")
_SINFO_JSON = ("sinfo", "--json")


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
        # What this Slurm answers (node and job commands, see the module docstring); None
        # until a JSON document has said.
        self._commands: parse_json.Commands | None = None
        # slurm.conf's ClusterName, read once: slurmdbd may serve several clusters, and only
        # this one's associations bind its jobs.
        self._cluster: str | None = None
        self._retry = retry(
            retry=retry_if_exception_type((SlurmUnreachable, SlurmBusy)),
            stop=stop_after_attempt(max(1, action_attempts)),
            wait=wait_exponential(multiplier=retry_wait_s, max=retry_wait_s * 8),
            reraise=True,
        )

    # ------------------------------------------------------------------ reads

    def read_cluster(self, now: float | None = None) -> ClusterSnapshot:
        before = self.slurm_calls()
        jobs = self.read_jobs()
        nodes = self.read_nodes()
        partitions = self.read_partitions()
        return ClusterSnapshot(
            taken_at=time.time() if now is None else now,
            jobs=jobs,
            nodes=nodes,
            partitions=partitions,
            slurm_calls=self.slurm_calls() - before,
        )

    def slurm_calls(self) -> int:
        """Calls to Slurm so far: client processes here (a subclass adds its RPCs)."""
        return self.runner.calls

    def read_jobs(self) -> tuple[JobView, ...]:
        if self.job_format == "text":
            # The text path has no admin comment (see parse_text.parse_squeue_text).
            return self._squeue_text(_SQUEUE_TEXT)
        out = self.runner.read(self._named(_SQUEUE_JSON), label="squeue --json").stdout
        doc = parse_json.decode(out, "squeue --json")
        jobs = parse_json.squeue(doc)
        self._commands = parse_json.commands(doc, "squeue --json")
        return jobs

    def _named(self, argv: tuple[str, ...]) -> tuple[str, ...]:
        """``argv``'s ``--json`` naming the data_parser once a document has told which
        (``parse_json.json_flag``; ``probe`` learns it at start-up): what a site sets as its
        default (``DataParserParameters``) then never changes what is read."""
        return argv if self._commands is None else self._commands.named(argv)

    def _squeue_text(self, argv: tuple[str, ...]) -> tuple[JobView, ...]:
        """``argv`` + ``-O`` with a separator made for this call (``parse_text``)."""
        separator = parse_text.new_separator()
        result = self.runner.read(
            (*argv, "-O", parse_text.squeue_format(separator)), label="squeue -O"
        )
        if "invalid job format" in result.stderr.lower():
            raise SlurmParseError(f"squeue -O: {result.stderr.strip().splitlines()[-1]}")
        return parse_text.parse_squeue_text(result.stdout, separator=separator)

    def read_nodes(self) -> tuple[NodeView, ...]:
        try:
            commands = self._commands
            if commands is None:
                doc, commands = self._learn_commands()
                if commands.nodes == _SINFO_JSON:
                    return parse_json.sinfo(doc)  # 22.05: the answer already
            command = commands.named(commands.nodes)
            return parse_json.nodes(self.runner.read(command).stdout, " ".join(command))
        except (SlurmRejected, SlurmParseError):
            self._commands = None  # perhaps another Slurm now: ask again next time
            raise

    def _learn_commands(self) -> tuple[Mapping[str, Any], parse_json.Commands]:
        """Read ``sinfo --json`` (every version has it) to learn ``self._commands``."""
        doc = parse_json.decode(self.runner.read(_SINFO_JSON).stdout, "sinfo --json")
        self._commands = parse_json.commands(doc, "sinfo --json")
        return doc, self._commands

    def read_partitions(self) -> tuple[PartitionView, ...]:
        out = self.runner.read(("scontrol", "-o", "show", "partition")).stdout
        return parse_text.parse_scontrol_partitions(out)

    def read_qos_node_limits(self) -> Mapping[str, int]:
        out = self.runner.read(
            ("sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxTRESPerJob"),
            label="sacctmgr show qos",
        ).stdout
        return parse_text.parse_qos_node_limits(out)

    def read_assoc_node_limits(self) -> Mapping[tuple[str, str, str], int]:
        if self._cluster is None:
            config = self.runner.read(("scontrol", "show", "config")).stdout
            self._cluster = _cluster_name(parse_text.parse_scontrol_config(config))
        argv = (
            "sacctmgr", "-n", "-P", "show", "assoc", f"cluster={self._cluster}",
            "format=Account,User,Partition,MaxNodes",
        )  # fmt: skip
        out = self.runner.read(argv, label="sacctmgr show assoc").stdout
        return parse_text.parse_assoc_node_limits(out)

    def read_history(self, since: float, until: float | None = None) -> tuple[JobHistory, ...]:
        window = ["-S", _slurm_time(since)]
        if until is not None:
            window += ["-E", _slurm_time(until)]
        if self.history_format == "json":
            # -D: 24.11+ leave a requeued job's earlier runs out of --json without it
            # (22.05 always listed them); the text path passes it too.
            argv = self._named(("sacct", "-a", "-D", "--json", *window))
            return parse_json.sacct(self.runner.read(argv, label="sacct --json").stdout)
        separator = parse_text.new_separator()
        argv = (*_SACCT_TEXT, f"--delimiter={separator}", *window)
        out = self.runner.read(argv, label="sacct -p").stdout
        return parse_text.parse_sacct_text(out, separator=separator)

    def read_job(self, job_id: int) -> JobView | None:
        """One job via ``scontrol --json show job`` (24.11+) or ``squeue -j ID -O`` with a
        fresh separator (22.05, whose scontrol has no ``--json`` and whose ``squeue --json``
        ignores ``-j``); for action pre-checks only, never per cycle.  Not ``scontrol -o``:
        a newline in the job's own comment would let its owner forge the record.

        Counted in ``runner.read_calls`` like every read; a cycle's observe cost is
        ``ClusterSnapshot.slurm_calls`` (3)."""
        # Learnt once at most: a cycle's reads have usually taught it already.
        commands = self._commands or self._learn_commands()[1]
        if commands.job is not None:
            out = self.runner.read((*commands.named(commands.job), str(job_id))).stdout
            found = [v for v in parse_json.scontrol_jobs(out) if v.job_id == job_id]
            return found[0] if found else None  # an unknown id: no jobs, exit status 0
        try:
            views = self._squeue_text(("squeue", "-h", "-t", "all", "-j", str(job_id)))
        except SlurmRejected as exc:
            if "invalid job id" in exc.slurm_message.lower():
                return None
            raise
        found = [v for v in views if v.job_id == job_id]
        return found[0] if found else None

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
            doc = parse_json.decode(self.runner.read(_SINFO_JSON).stdout, "sinfo --json")
            # openapi/v0.0.38 (22.05), data_parser/v0.0.42 (24.11), data_parser/v0.0.45 (26.05)
            plugin: str | None = parse_json.plugin_type(doc, "sinfo --json")
        except (SlurmRejected, SlurmParseError):
            plugin = None  # no --json in this Slurm (or no serializer plugin installed)
        else:
            with contextlib.suppress(SlurmParseError):  # a generation the parsers lack
                self._commands = parse_json.commands(doc, "sinfo --json")
        scheduler = config.get("SchedulerParameters", "")
        self._cluster = config.get("ClusterName", "").lower() or None
        return Capabilities(
            version=version,
            json_plugin=plugin,
            permit_job_expansion="permit_job_expansion" in scheduler.split(","),
            multiple_slurmd=config.get("MULTIPLE_SLURMD", "").lower() == "yes",
            leaks_nodes_after_shrink=leaks_nodes_after_shrink(version),
            private_data=parse_text.private_data(config.get("PrivateData", "")),
            slurm_user=config.get("SlurmUser", "").split("(", 1)[0].strip(),
            admins=self._admins(),
        )

    def _admins(self) -> frozenset[str]:
        """Users whose AdminLevel is Operator or Administrator (they see every job, as in
        Slurm); none, with a warning, when slurmdbd cannot say: fewer see all, never more."""
        argv = ("sacctmgr", "-n", "-P", "show", "user", "format=User,AdminLevel")
        try:
            out = self.runner.read(argv, label="sacctmgr show user").stdout
        except SlurmError as exc:
            log.warning("slurm.admins_unknown", error=str(exc))
            return frozenset()
        return parse_text.parse_admins(out)

    # ------------------------------------------------------------------ actions

    def pin_pending_size(
        self,
        job_id: int,
        nodes: int,
        partition: str | None = None,
        submitted: Collection[str] = (),
    ) -> None:
        _positive(job_id, "job id")
        _positive(nodes, "node count")
        job = self._require_state(job_id, JobState.PENDING, "pin the size of")
        change = [f"NumNodes={nodes}-{nodes}"]
        if partition is not None:
            check_own_partitions(job_id, partition, job.partitions, submitted)
            change.insert(0, f"Partition={partition}")
        self._idempotent(
            lambda: self.runner.act(("scontrol", "update", f"JobId={job_id}", *change))
        )
        log.info("slurm.pin_pending_size", job_id=job_id, nodes=nodes, partition=partition)

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
        entry = pwd.getpwnam(user)
        if work_dir is None:
            work_dir = entry.pw_dir
        # Nothing of the daemon's process reaches the job: environment, limits, umask
        # (slurm.owner says what the job gets instead).
        clean = submit_prefix(submit_environment(entry, self.runner.env().get("SLURM_CONF")))
        argv = ["sbatch", "--parsable", *SUBMIT_OPTIONS, f"--nodes={nodes}"]
        argv.append(f"--partition={partition}")
        argv.append(f"--chdir={work_dir}")
        for flag, value in (("account", account), ("qos", qos), ("job-name", name)):
            if value:
                argv.append(f"--{flag}={value}")
        if comment is not None:
            argv.append(f"--comment={comment}")
        argv.extend(extra_args)
        result = self.runner.act((*clean, *prefix, *argv), stdin=script)
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


def _cluster_name(config: Mapping[str, str]) -> str:
    # slurmdbd keeps cluster names lower-case (slurmctld lowers ClusterName too).
    name = config.get("ClusterName", "").lower()
    if not name:
        raise SlurmParseError("scontrol show config: no ClusterName")
    return name


def _positive(value: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ActionRefused(f"{what} must be a positive integer, got {value!r}")


def _keep_nodes(job: JobView, nodes: int) -> tuple[str, ...]:
    """The first ``nodes`` nodes, always including the batch host (never removed)."""
    if job.batch_host is None or job.batch_host in job.nodes[:nodes]:
        return job.nodes[:nodes]
    others = [n for n in job.nodes if n != job.batch_host]
    return (job.batch_host, *others[: nodes - 1])
