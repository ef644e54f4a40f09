"""``slurm-elastic run``: start torch elastic training on the job's nodes and keep it going.

Parent mode (in the batch script, on the batch host):

1. read the job from Slurm (one ``scontrol`` call): nodes, batch host, elastic marker;
2. pick the rendezvous endpoint (batch host's ``NodeAddr``, a port unique to the job),
   write ``launch.json`` into the job directory;
3. start the follower thread (daemon instructions -> hold / ack / resume);
4. ``srun --ntasks-per-node=1 python -m slurm_elastic.agent.node`` on every node, with the
   Slurm environment recomputed from the current allocation; if the step ends without the
   training having finished (and at least ``min`` nodes remain), launch it again.

Companion mode (``--join PARENT``, in a companion job started in the parent's directory):
read the parent's ``launch.json`` and run the same node agents in this job's allocation, in
the parent's environment (``environment.json``); they join the parent's rendezvous and
torch elastic widens the group.

In the torchft mode (``--mode torchft``, ``agent.modes``) the endpoint in ``launch.json`` is
the torchft lighthouse's, which the parent launcher runs beside itself
(``agent.lighthouse``); every node agent runs one replica group that joins it, the parent's
as a companion's, and a shrink makes the leaving groups leave (``agent.follower``).

Outside kills (the torchft mode): torchft's managers and lighthouse end a replica group on a
kill request from anyone who reaches their ports (torchft 0.2 has no authentication;
docs/security.md).  The launcher reads the managers' line for each (``agent.srunlog``): a
step that such requests ended does not spend the relaunch budget (``RunOptions.
max_relaunches``, 2), and once ``OUTSIDE_KILL_LIMIT`` groups were ended that way the parent
falls back to the restart mode for the rest of the job (``fall_back_to_restart``), which has
no kill request to answer.

torch is never imported here: the launcher runs wherever ``slurm-elastic`` is installed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import IO, Protocol

import structlog

from slurm_elastic.agent.allocation import effective_nodes, read_job, running_steps, srun_env
from slurm_elastic.agent.follower import ControlWriter, Follower
from slurm_elastic.agent.jobdir import (
    DONE,
    LaunchInfo,
    companion_environment,
    job_dir,
    read_json,
    save_environment,
)
from slurm_elastic.agent.lighthouse import Lighthouse
from slurm_elastic.agent.modes import (
    DEFAULT_FT_TIMEOUT_S,
    FALLBACK_OUTSIDE_KILLS,
    TORCHFT,
    TORCHRUN,
    FtTimeouts,
)
from slurm_elastic.agent.node import COMPANION, PARENT, node_addr
from slurm_elastic.agent.owndir import OwnDir
from slurm_elastic.agent.rendezvous import choose_port
from slurm_elastic.agent.srunlog import PlannedRemoval, StepReport, copy_stderr
from slurm_elastic.errors import AgentError, MarkerError
from slurm_elastic.protocol import api_base
from slurm_elastic.types import JobState, JobView

log = structlog.get_logger("slurm_elastic.agent")


@dataclass(frozen=True, slots=True)
class RunOptions:
    argv: tuple[str, ...]
    nproc_per_node: int = 1
    min_nodes: int | None = None
    max_nodes: int | None = None
    max_restarts: int = 100
    max_relaunches: int = 2
    poll_s: float = 1.0
    join: int | None = None
    rdzv_conf: tuple[tuple[str, str], ...] = ()
    stop_signal: str = "USR1"  # the signal contract (agent.stopping)
    stop_grace_s: float = 30.0
    mode: str = TORCHRUN  # agent.modes
    ft_timeout_s: float = DEFAULT_FT_TIMEOUT_S


def _env_int(name: str) -> int:
    value = os.environ.get(name, "")
    if not value.isdigit():
        raise AgentError(f"${name} is not set: run slurm-elastic run inside a Slurm batch job")
    return int(value)


def resolve_sizes(view: JobView, opts: RunOptions) -> tuple[int, int]:
    """(min, max) nodes: command-line options, else the elastic marker, else [1, current].

    A running job's requested node range is no longer visible in Slurm, so the marker in
    its comment (or the options) is the only source of the range.
    """
    low, high = 1, max(1, view.node_count)
    try:
        from slurm_elastic.marker import resolve_spec

        spec = resolve_spec(view.comment, low, high)
    except (ImportError, MarkerError) as exc:
        log.info("agent.marker_unused", reason=str(exc))
        spec = None
    if spec is not None:
        low, high = spec.min_nodes, spec.max_nodes
    low = opts.min_nodes if opts.min_nodes is not None else low
    high = opts.max_nodes if opts.max_nodes is not None else high
    if not 1 <= low <= high:
        raise AgentError(f"invalid node range {low}:{high} (need 1 <= min <= max)")
    return low, high


def work_dir_of(view: JobView) -> str:
    """Where the job directory lives: the job's WorkDir per Slurm (see ``agent.jobdir``)."""
    return view.work_dir or os.environ.get("SLURM_SUBMIT_DIR") or os.getcwd()


def parent_info(opts: RunOptions, job_id: int, view: JobView) -> LaunchInfo:
    low, high = resolve_sizes(view, opts)
    batch_host = view.batch_host or os.environ.get("SLURMD_NODENAME", "")
    if not batch_host:
        raise AgentError(f"job {job_id} has no batch host yet")
    host = node_addr(batch_host) or socket.gethostname()
    return LaunchInfo(
        job_id=job_id,
        argv=opts.argv,
        nproc_per_node=opts.nproc_per_node,
        rdzv_host=host,
        rdzv_port=choose_port(host),
        rdzv_id=f"slurm-elastic-{job_id}",
        min_nodes=low,
        max_nodes=high,
        batch_host=batch_host,
        max_restarts=opts.max_restarts,
        api=api_base(),
        job_dir=str(job_dir(work_dir_of(view), job_id)),
        created_at=time.time(),
        rdzv_conf=dict(opts.rdzv_conf),
        stop_signal=opts.stop_signal,
        stop_grace_s=opts.stop_grace_s,
        mode=opts.mode,
        ft_timeout_s=opts.ft_timeout_s,
    )


# After the launcher is told to stop, how long srun may report its tasks' ends.
STOP_WINDOW_S = 120.0
# How often the parent launcher checks that its torchft lighthouse still runs.
LIGHTHOUSE_POLL_S = 0.5
# After training is done, how long a companion's workers may take to end by themselves once
# its parent has ended (watch_parent).
FINISH_GRACE_S = 30.0
# Replica groups ended by torchft kill requests before the parent leaves the torchft mode: a
# 3-node job's every group once.  Each such end costs the job a group until the step ends;
# the restart mode costs a restart per resize instead, and answers no kill request.
OUTSIDE_KILL_LIMIT = 3
FALLBACK_WAIT_S = 90.0  # the fallback's end_old_steps waits up to 60 s for the step to end


class OutsideKills:
    """The replica groups that torchft kill requests ended, over the launcher's life
    (thread-safe): ``srun``'s stderr copier adds each (``StepReport.on_kill_request``), and
    ``reached`` is set at ``limit``."""

    def __init__(self, limit: int = OUTSIDE_KILL_LIMIT) -> None:
        self.limit = limit
        self.reached = threading.Event()
        # Set by ``watch_outside_kills`` once it acted on ``reached`` (or was told the job
        # is ending): a relaunch waits for it, so it never starts in the mode being left.
        self.handled = threading.Event()
        self.watched = False
        self._lock = threading.Lock()
        self._count = 0

    @property
    def count(self) -> int:
        with self._lock:
            return self._count

    def add(self) -> None:
        with self._lock:
            self._count += 1
            if self._count >= self.limit:
                self.reached.set()


class _Step:
    """The running ``srun``; forwards the launcher's SIGTERM/SIGINT to it, and passes its
    stderr on with a planned shrink's task ends told as such (``agent.srunlog``)."""

    def __init__(self, removal: PlannedRemoval | None = None, out: IO[bytes] | None = None) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.removal = removal or PlannedRemoval()
        self.outside = OutsideKills()
        self.report = StepReport()  # of the last run
        self._out = out

    def forward(self, signum: int, _frame: FrameType | None) -> None:
        self.stopping = True
        # The tasks end because this step is stopped: srun's reports of it are not errors.
        self.removal.open((), STOP_WINDOW_S)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)

    def run(self, argv: list[str], env: dict[str, str]) -> int:
        try:
            self.proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
        except OSError as exc:
            raise AgentError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
        assert self.proc.stderr is not None
        self.report = StepReport(on_kill_request=self.outside.add)
        copier = threading.Thread(
            target=copy_stderr,
            args=(self.proc.stderr, self.removal, self._out or sys.stderr.buffer, self.report),
            name="slurm-elastic-srun-stderr",
            daemon=True,
        )
        copier.start()
        rc = self.proc.wait()
        copier.join(timeout=10.0)  # the rest of srun's output, unless a task still holds it
        return rc


def srun_argv(info: LaunchInfo, nodes: int, role: str, *, relaunch: bool) -> list[str]:
    argv = [
        "srun",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
        f"--job-name=slurm-elastic-{role}",
    ]
    if relaunch:
        argv.append("--overlap")  # an old step may still be releasing its CPUs
    return [*argv, sys.executable, "-m", "slurm_elastic.agent.node", info.job_dir, role]


def training_done(info: LaunchInfo) -> bool:
    """Whether the job's training has finished (rank 0 wrote ``done.json``)."""
    return read_json(Path(info.job_dir) / DONE) is not None


def watch_parent(
    parent: int,
    step: _Step,
    poll_s: float,
    *,
    done: Callable[[], bool] = lambda: False,
    running: Callable[[int], bool] | None = None,
    finish_grace_s: float = FINISH_GRACE_S,
) -> threading.Event:
    """Companion side: stop this job's workers when the parent is gone.

    The daemon cancels orphan companions, but a companion must not depend on it: without
    the parent's batch host there is no rendezvous store to train with.  When the parent
    ended because training is done (``done``), the workers here are ending too: they get
    ``finish_grace_s`` to do so by themselves, since stopping the step makes Slurm write
    its "CANCELLED" error lines into the output.
    """
    stop = threading.Event()
    is_running = running or _parent_running

    def loop() -> None:
        while not stop.wait(poll_s):
            if is_running(parent):
                continue
            if done():
                log.info("agent.parent_done", parent=parent)
                if stop.wait(finish_grace_s):
                    return  # the step ended by itself
            else:
                log.warning("agent.parent_gone", parent=parent)
            step.forward(signal.SIGTERM, None)
            return

    threading.Thread(target=loop, name="slurm-elastic-parent", daemon=True).start()
    return stop


def _parent_running(parent: int) -> bool:
    try:
        return read_job(parent).state is JobState.RUNNING
    except AgentError:  # unknown to Slurm: ended longer than MinJobAge ago
        return False


class Restartable(Protocol):
    """What ``watch_lighthouse`` needs of the lighthouse (``agent.lighthouse.Lighthouse``)."""

    def alive(self) -> bool: ...

    @property
    def returncode(self) -> int | None: ...

    def start(self, timeout_s: float = 30.0) -> None: ...


def watch_lighthouse(
    lighthouse: Restartable,
    step: _Step,
    poll_s: float,
    *,
    end_step: Callable[[], None],
    done: Callable[[], bool] = lambda: False,
) -> threading.Event:
    """Parent side, torchft mode: what a lighthouse that died costs the job.

    Without it no quorum forms, and every replica group waits in its quorum until the
    quorum timeout and then fails (a new lighthouse at the same address does not revive
    those waits: measured with torchft 0.2).  So the launcher falls back to what the
    torchrun mode does at every resize: it starts a new lighthouse at the same address,
    ends the step at once (``end_step``) and ``launch_steps`` relaunches it; the new groups
    restore the last checkpoint and meet in the new lighthouse, stop-free again from there.
    Each such relaunch counts against the relaunch budget (``RunOptions.max_relaunches``,
    2): a lighthouse that keeps dying ends the job.  If no new lighthouse starts, the job is
    stopped with the reason, never left waiting.  A lighthouse that ends with the job (the
    launcher told to stop, or training done) is left alone.
    """
    stop = threading.Event()

    def ending() -> bool:
        return stop.is_set() or step.stopping or done()

    def loop() -> None:
        while not stop.wait(poll_s):
            if lighthouse.alive():
                continue
            # The job's own end signals the lighthouse too: give the launcher its turn.
            if stop.wait(poll_s) or ending():
                return
            log.warning(
                "agent.lighthouse_died",
                rc=lighthouse.returncode,
                fallback="a new lighthouse; every group restarts from its last checkpoint",
            )
            try:
                lighthouse.start()
            except AgentError as exc:
                log.error("agent.lighthouse_lost", error=str(exc))
                step.forward(signal.SIGTERM, None)
                return
            if not ending():
                try:
                    end_step()
                except AgentError as exc:  # Slurm unreachable: the quorum timeout ends it
                    log.error("agent.step_not_ended", error=str(exc))

    threading.Thread(target=loop, name="slurm-elastic-lighthouse-watch", daemon=True).start()
    return stop


def relaunch_with_new_lighthouse(info: LaunchInfo, job_id: int) -> None:
    """After a new lighthouse started (``watch_lighthouse``): count it in ``launch.json``,
    which the relaunched groups (and companions' relaunches) read, so their steps' generations
    stay ahead of the old lighthouse's; then end the step.  Its groups wait in a quorum that
    never comes and cannot checkpoint: KILL, not the stop signal."""
    current = reload(info)
    replace(current, lighthouse_epoch=current.lighthouse_epoch + 1).save()
    end_old_steps(job_id, signal_name="KILL")


def end_old_steps(job_id: int, timeout_s: float = 60.0, signal_name: str | None = None) -> None:
    """Cancel what is left of the previous step before launching the next.

    When ``srun`` itself dies, Slurm lets its tasks run on for a while: a new step beside
    them would train a second copy from the same checkpoints.
    """
    old = running_steps(job_id)
    if not old:
        return
    log.warning("agent.cancel_old_steps", steps=old, signal=signal_name)
    how = [f"--signal={signal_name}"] if signal_name else []
    subprocess.run(["scancel", *how, *old], capture_output=True, timeout=30, check=False)
    deadline = time.monotonic() + timeout_s
    while running_steps(job_id) and time.monotonic() < deadline:
        time.sleep(0.5)


def fresh_rendezvous(info: LaunchInfo, attempt: int) -> LaunchInfo:
    """A relaunched step needs a new rendezvous: the old store's port may still be held by a
    dying agent (EADDRINUSE), and its state belongs to the dead group.  Companions read the
    new endpoint from launch.json."""
    fresh = replace(
        info,
        rdzv_port=choose_port(info.rdzv_host),
        rdzv_id=f"slurm-elastic-{info.job_id}-{attempt}",
    )
    fresh.save()
    return fresh


def reload(info: LaunchInfo) -> LaunchInfo:
    """A companion's relaunch joins whatever rendezvous the parent runs now."""
    return LaunchInfo.load(Path(info.job_dir))


def launch_steps(
    info: LaunchInfo,
    own_job: int,
    role: str,
    opts: RunOptions,
    step: _Step,
    environ: Mapping[str, str] = os.environ,
) -> int:
    """Run srun until training is done; relaunch a step that died early, boundedly.
    ``environ``: the workers' environment before Slurm's for the step is put in.

    A step that torchft kill requests ended (module doc) is relaunched without spending the
    relaunch budget (``RunOptions.max_relaunches``): it is for the job's own failures.
    Outside kills are bounded apart (``OutsideKills``: past its limit the parent leaves the
    torchft mode)."""
    rc = 1
    failures = 0  # steps that ended early of the job's own doing
    attempt = 0
    while True:
        view = read_job(own_job)
        if attempt and (role == PARENT and view.node_count < info.min_nodes):
            log.error("agent.below_min", nodes=view.node_count, min_nodes=info.min_nodes)
            break
        if attempt:
            if step.outside.watched and step.outside.reached.is_set():
                # The step may have ended (its groups all killed) before the fallback that
                # the kills started has rewritten launch.json: relaunch after it.
                step.outside.handled.wait(FALLBACK_WAIT_S)
            end_old_steps(own_job)
            # A companion joins whatever the parent runs now; the parent's own launch.json
            # may say the restart mode since the last step (fall_back_to_restart).
            info = reload(info)
            if role == PARENT and info.mode == TORCHRUN:
                info = fresh_rendezvous(info, attempt)
            # (the torchft mode's lighthouse outlives a step, unless it died)
        if role == COMPANION and training_done(info):
            log.info("agent.training_done", parent=info.job_id, job=own_job)
            return 0
        env = srun_env(environ, view.nodes)
        argv = srun_argv(info, len(view.nodes), role, relaunch=attempt > 0)
        log.info("agent.srun", attempt=attempt, nodes=list(view.nodes), role=role)
        rc = step.run(argv, env)
        # done.json: Slurm counts the tasks it killed on removed nodes in srun's status,
        # so a finished training can end with a non-zero one; a script without the library
        # writes no done.json, and then srun's own report tells (agent.srunlog).
        finished = read_json(Path(info.job_dir) / DONE) is not None
        if rc != 0 and not finished and step.report.tasks_succeeded():
            log.info("agent.step_shrunk", rc=rc, reason="every task left ended with 0")
            finished = True
        if rc == 0 or finished:
            if role == COMPANION and read_json(Path(info.job_dir) / DONE) is None:
                log.info("agent.companion_released", job=own_job)  # given back by a shrink
            else:
                log.info("agent.done", srun_rc=rc)
            return 0
        if step.stopping:
            break
        killed = step.report.kill_requests
        # Free up to the limit; past it a parent has left the torchft mode (no kill request
        # reaches it any more), and a companion's further ones count as its own failures.
        if not killed or (role == COMPANION and step.outside.reached.is_set()):
            failures += 1
        log.warning(
            "agent.step_ended",
            rc=rc,
            attempt=attempt,
            relaunches_left=max(0, opts.max_relaunches - failures),
            groups_killed_from_outside=killed,
        )
        if failures > opts.max_relaunches:
            break
        attempt += 1
    return rc or 1


def fall_back_to_restart(info: LaunchInfo, job_id: int, kills: int) -> LaunchInfo:
    """The parent's answer to outside kills past ``OUTSIDE_KILL_LIMIT`` (module doc), after
    its lighthouse was stopped: ``launch.json`` says the restart mode from now on (``mode``,
    ``fallback``), which the relaunched step's node agents and every companion's relaunch
    read; then the step is ended with SIGTERM, on which each group saves its last
    completed step (``agent.boundary``), and ``launch_steps`` relaunches it under torchrun
    from there."""
    current = replace(reload(info), mode=TORCHRUN, fallback=FALLBACK_OUTSIDE_KILLS)
    current.save()
    log.warning(
        "agent.fallback",
        mode=TORCHRUN,
        reason=f"{kills} replica groups were ended by torchft kill requests from outside "
        "the job; it resizes by restarting from now on",
    )
    end_old_steps(job_id, signal_name="TERM")
    return current


def watch_outside_kills(
    outside: OutsideKills, fall_back: Callable[[], None], *, ending: Callable[[], bool]
) -> threading.Event:
    """Parent side, torchft mode: ``fall_back`` once ``outside`` reaches its limit, unless
    the job is ending anyway (``ending``).  Set the returned event to stop watching."""
    stop = threading.Event()
    outside.watched = True

    def loop() -> None:
        try:
            while not stop.is_set():
                if outside.reached.wait(LIGHTHOUSE_POLL_S):
                    if not (stop.is_set() or ending()):
                        fall_back()
                    return
        finally:
            outside.handled.set()

    threading.Thread(target=loop, name="slurm-elastic-outside-kills", daemon=True).start()
    return stop


def run(opts: RunOptions) -> int:
    job_id = _env_int("SLURM_JOB_ID")
    step = _Step()
    signal.signal(signal.SIGTERM, step.forward)
    signal.signal(signal.SIGINT, step.forward)
    if opts.join is not None:
        try:
            parent = read_job(opts.join)
        except AgentError as exc:
            raise AgentError(f"cannot join job {opts.join}: {exc}") from None
        info = LaunchInfo.load(job_dir(work_dir_of(parent), opts.join))
        log.info("agent.join", parent=info.job_id, endpoint=info.rdzv_endpoint, job=job_id)
        if training_done(info):
            # Grown in the seconds between the end of training and the parent's end.
            log.info("agent.training_done", parent=info.job_id, job=job_id)
            return 0
        watcher = watch_parent(
            info.job_id, step, max(opts.poll_s, 2.0), done=lambda: training_done(info)
        )
        environ = companion_environment(os.environ, Path(info.job_dir))
        try:
            return launch_steps(info, job_id, COMPANION, opts, step, environ)
        finally:
            watcher.set()
    if not opts.argv:
        raise AgentError("nothing to run: give the training command after --")
    info = parent_info(opts, job_id, read_job(job_id))
    own = OwnDir(info.job_dir)
    own.ensure()  # made 0700, or refused when another user's (agent.owndir)
    own.unlink(DONE)
    save_environment(Path(info.job_dir), os.environ)
    lighthouse: Lighthouse | None = None
    watches: list[threading.Event] = []
    if info.mode == TORCHFT:
        FtTimeouts.derive(info.ft_timeout_s)  # the workers' levels, refused before they start
        lighthouse = Lighthouse(info.rdzv_host, info.rdzv_port)
        lighthouse.start()
        watches.append(
            watch_lighthouse(
                lighthouse,
                step,
                LIGHTHOUSE_POLL_S,
                end_step=lambda: relaunch_with_new_lighthouse(info, job_id),
                done=lambda: training_done(info),
            )
        )
    try:
        return _run_parent(info, opts, job_id, step, lighthouse, watches)
    finally:
        for watch in watches:
            watch.set()
        if lighthouse is not None:
            lighthouse.stop()


def _run_parent(
    info: LaunchInfo,
    opts: RunOptions,
    job_id: int,
    step: _Step,
    lighthouse: Lighthouse | None,
    watches: list[threading.Event],
) -> int:
    info.save()
    log.info(
        "agent.launch",
        job=job_id,
        mode=info.mode,
        endpoint=info.rdzv_endpoint,
        nodes=f"{info.min_nodes}:{info.max_nodes}",
        argv=list(info.argv),
    )
    control = ControlWriter(Path(info.job_dir))
    # SIGUSR1 to the batch shell (scancel --signal=USR1 --batch) asks for a checkpoint; it
    # must never kill the launcher, which Python's default action would.
    signal.signal(signal.SIGUSR1, lambda *_: control.issue("checkpoint"))
    follower = Follower(
        job_id=job_id,
        job_dir=Path(info.job_dir),
        api=info.api,
        min_nodes=info.min_nodes,
        batch_host=info.batch_host,
        control=control,
        node_count=lambda: effective_nodes(job_id),
        poll_s=opts.poll_s,
        removal=step.removal,
        stop_grace_s=info.stop_grace_s,
        mode=info.mode,
    )
    if lighthouse is not None:

        def fall_back() -> None:
            for watch in watches:
                watch.set()  # the lighthouse's end is this fallback's, not a death
            lighthouse.stop()
            follower.mode = TORCHRUN
            fall_back_to_restart(info, job_id, step.outside.count)

        watches.append(
            watch_outside_kills(
                step.outside, fall_back, ending=lambda: step.stopping or training_done(info)
            )
        )
    follower.start()
    try:
        return launch_steps(info, job_id, PARENT, opts, step)
    finally:
        follower.stop()
