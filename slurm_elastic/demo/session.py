"""One demo run: cluster, daemon, the job mix arriving over time, live status, clean stop.

The loop polls Slurm once a second (one ``read_cluster``: the same batched read the
daemon makes), submits the jobs whose arrival time has come with plain ``sbatch``, folds
what it sees into per-job size timelines (``observe``) and redraws ``slurm-elastic
status`` every few seconds.  Ctrl-C (SIGINT) or SIGTERM only sets a flag: the loop ends,
the daemon is stopped (SIGTERM), every demo job and companion is cancelled, and the
cluster is left up for ``make test`` or another demo (``make cluster-down`` stops it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from slurm_elastic.demo import harness
from slurm_elastic.demo.observe import Event, JobTrack, Observer
from slurm_elastic.demo.workload import DEFAULT_MODE, FULL, QUICK, DemoJob
from slurm_elastic.errors import SlurmError, SlurmRejected
from slurm_elastic.slurm.cli import CliBackend

Echo = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """Where and how long the demo runs, on which cluster instance and Slurm version."""

    out: Path
    instance: int = 0
    slurm: str = harness.DEFAULT_SLURM
    quick: bool = False
    time_limit_s: float | None = None  # default: 560 s (full) / 200 s (quick)
    mode: str = DEFAULT_MODE  # how the elastic jobs resize (slurm-elastic run --mode)
    poll_s: float = 1.0
    refresh_s: float = 3.0

    @property
    def jobs(self) -> tuple[DemoJob, ...]:
        return QUICK if self.quick else FULL

    @property
    def limit_s(self) -> float:
        if self.time_limit_s is not None:
            return self.time_limit_s
        return 200.0 if self.quick else 560.0


@dataclass(slots=True)
class RunRecord:
    """Everything the report needs, gathered while the demo runs."""

    started_at: float
    out: Path = Path("demo-out")
    mode: str = DEFAULT_MODE
    finished_at: float = 0.0
    stop_reason: str = ""
    cluster_line: str = ""
    tracks: dict[int, JobTrack] = field(default_factory=dict)
    jobs: dict[int, DemoJob] = field(default_factory=dict)
    progress: dict[int, dict[float, int]] = field(default_factory=dict)  # job -> t -> step
    pins: set[tuple[int, int]] = field(default_factory=set)  # (job, nodes) the daemon pinned
    daemon_exit: int | None = None


class Demo:
    """One demo run: the daemon and the workload on the local cluster, observed to the end."""

    def __init__(self, opts: DemoOptions, echo: Echo, *, tty: bool | None = None) -> None:
        self.opts = opts
        self.echo = echo
        self.tty = sys.stdout.isatty() if tty is None else tty
        self.out = opts.out.resolve()
        self.backend = CliBackend(timeout_s=20)
        self.observer = Observer()
        self.stop_reason = ""
        self.record = RunRecord(started_at=time.time(), out=self.out, mode=opts.mode)
        self.daemon: harness.Daemon | None = None
        self.config_path = self.out / "daemon.yaml"
        self.submit_dir = self.out / "jobs"
        self._last_table: list[str] = []
        self._log: list[str] = []

    # ------------------------------------------------------------------ entry point

    def run(self) -> RunRecord:
        harness.require_clone()
        self._prepare_out()
        self.echo(f"slurm-elastic demo: output in {self.out}")
        self.record.cluster_line = harness.cluster_up(self.opts.slurm, self.opts.instance)
        self.echo(self.record.cluster_line)
        self._require_empty_cluster()
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            self._start_daemon()
            self._loop()
        finally:
            self.record.daemon_exit = self.daemon.stop() if self.daemon else None
            self._cancel_demo_jobs()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.record.finished_at = time.time()
            self.record.stop_reason = self.stop_reason or "every job finished"
            self.record.tracks = self.observer.tracks
        return self.record

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.stop_reason = f"interrupted ({signal.Signals(signum).name})"

    # ------------------------------------------------------------------ set-up

    def _prepare_out(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        for name in ("state", "jobs"):
            shutil.rmtree(self.out / name, ignore_errors=True)
        for name in ("daemon.log", "summary.json", "timeline.png", "status.txt"):
            (self.out / name).unlink(missing_ok=True)

    def _require_empty_cluster(self) -> None:
        """The demo needs the 4 nodes to itself: someone else's jobs would bend the story."""
        deadline = time.monotonic() + 60
        while True:
            snap = self.backend.read_cluster()
            active = [j.job_id for j in snap.jobs if j.state.is_active]
            idle = [n for n in snap.nodes if n.is_usable and n.state == "idle"]
            if not active and len(idle) == len(snap.nodes) == harness.NODES:
                break
            if active or time.monotonic() > deadline:
                why = (
                    f"{len(active)} active job(s) ({', '.join(map(str, active[:5]))})"
                    if active
                    else f"{len(idle)} of {len(snap.nodes)} nodes idle"
                )
                raise SlurmRejected(
                    f"cluster instance {self.opts.instance} is busy: {why}; the demo needs its "
                    f"{harness.NODES} nodes to itself (wait, or use --instance K)"
                )
            time.sleep(1)
        # Leftovers of someone else's earlier shrink (Slurm 22.05 node leak) are not the
        # demo's: clear them once.  During the demo the daemon itself reconfigures after a
        # job it shrank has ended (slurm.reconfigure_after_shrink).
        subprocess.run(["scontrol", "reconfigure"], capture_output=True, timeout=30, check=False)

    def _start_daemon(self) -> None:
        port = harness.free_port()
        self.config_path, self.config = harness.write_config(self.out, port, quick=self.opts.quick)
        self.api = f"http://127.0.0.1:{port}"
        self.submit_dir.mkdir(parents=True, exist_ok=True)
        self.daemon = harness.Daemon(self.config_path, self.out / "daemon.log", self.submit_dir)
        self.daemon.start()
        self.daemon.wait_ready(self.out / "state" / "status.json")
        g = self.config.guards
        self.echo(
            f"daemon up: mode {self.config.mode}, policy {self.config.policy.name}, every "
            f"{self.config.interval_s:g}s, cooldown {g.cooldown_s:g}s, dwell {g.min_dwell_s:g}s, "
            f"API {self.api} (config {self.config_path}, log {self.out / 'daemon.log'})"
        )
        how = {"torchft": "stop-free: the nodes that stay keep training", "torchrun": "restart"}
        self.echo(f"elastic jobs resize with --mode {self.opts.mode} ({how[self.opts.mode]})")
        self.echo("job mix (arrival after start, nodes, role):")
        for job in self.opts.jobs:
            kind = "elastic" if job.elastic else "rigid"
            self.echo(
                f"  +{job.arrive_s:>3.0f}s  {job.name:<11} {kind:<7} -N{job.nodes_option:<4} "
                f"{job.role}"
            )

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        t0 = time.time()
        self.record.started_at = t0
        queue = sorted(self.opts.jobs, key=lambda j: j.arrive_s)
        next_refresh = 0.0
        while not self.stop_reason:
            now = time.time()
            while queue and now - t0 >= queue[0].arrive_s:
                self._submit(queue.pop(0), now)
            try:
                snapshot = self.backend.read_cluster(time.time())
            except SlurmError as exc:
                if self.stop_reason:
                    break
                self._note(now, f"squeue failed ({exc}); retrying")
                time.sleep(self.opts.poll_s)
                continue
            self._read_progress()  # first: it names the pins the events below may show
            for event in self.observer.add(snapshot):
                self._note(event.t, self._describe(event))
            if time.monotonic() >= next_refresh:
                self._show_status(now - t0)
                next_refresh = time.monotonic() + self.opts.refresh_s
            if not queue and all(t.finished for t in self.observer.tracks.values()):
                self._show_status(time.time() - t0)
                break
            if now - t0 > self.opts.limit_s:
                self.stop_reason = f"time limit ({self.opts.limit_s:.0f}s) reached"
                break
            if self.daemon is not None and not self.daemon.alive():
                self.stop_reason = f"the daemon exited: {self.daemon.tail()}"
                break
            time.sleep(max(0.0, self.opts.poll_s - (time.time() - now)))

    def _submit(self, job: DemoJob, now: float) -> None:
        work = self.out / "jobs" / job.name
        job_id = harness.submit_job(
            job, work, api=self.api, submit_dir=self.submit_dir, mode=self.opts.mode
        )
        self.record.jobs[job_id] = job
        self.observer.track(
            JobTrack(job_id, job.name, job.elastic, (job.min_nodes, job.max_nodes), now)
        )
        self._note(
            now,
            f"submitted {job.name} ({job_id}): sbatch -N{job.nodes_option}"
            + (" --elastic" if job.elastic else ""),
        )

    def _read_progress(self) -> None:
        """Each elastic job's latest reported step, and the pins the daemon applied (to name
        a start-at-size whose pin and start fell between two polls), from its status."""
        try:
            doc = json.loads((self.out / "state" / "status.json").read_text())
        except (OSError, ValueError):
            return
        for action in doc.get("actions", []):
            if action.get("kind") == "start_at_size" and action.get("outcome") == "applied":
                self.record.pins.add((int(action["job_id"]), int(action["to_nodes"])))
        for row in doc.get("jobs", []):
            job_id, at, step = row.get("job_id"), row.get("reported_at"), row.get("step")
            if job_id in self.record.jobs and at is not None and step is not None:
                self.record.progress.setdefault(job_id, {})[float(at)] = int(step)

    # ------------------------------------------------------------------ output

    def _describe(self, event: Event) -> str:
        tr = self.observer.tracks[event.job_id]
        who = f"{tr.name} ({event.job_id})"
        if event.kind == "start_at_size":
            return f"{who} STARTED AT SIZE {event.to_nodes} ({event.detail})"
        if event.kind == "start" and (event.job_id, event.to_nodes) in self.record.pins:
            return f"{who} STARTED AT SIZE {event.to_nodes} (pinned by the daemon)"
        if event.kind == "start":
            return f"{who} started on {event.to_nodes} node(s)"
        if event.kind in ("shrink", "grow"):
            return f"{who} {event.kind.upper()} {event.from_nodes} -> {event.to_nodes} nodes"
        return f"{who} ended ({event.detail})"

    def _note(self, t: float, text: str) -> None:
        line = f"+{t - self.record.started_at:5.0f}s  {text}"
        self._log.append(line)
        if not self.tty:
            self.echo(line)

    def _show_status(self, elapsed: float) -> None:
        done = subprocess.run(
            ["slurm-elastic", "status", "--config", str(self.config_path)],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
            env={**dict(os.environ), "COLUMNS": "160"},
        )
        table = (done.stdout or done.stderr).rstrip().splitlines()
        (self.out / "status.txt").write_text("\n".join(table) + "\n")
        header = f"--- +{elapsed:.0f}s  $ slurm-elastic status --config {self.config_path.name}"
        if self.tty:
            # Plain redraw: clear the screen, then the table and the latest events.
            self.echo("\x1b[H\x1b[2J" + header)
            for line in [*table, "", *self._log[-12:]]:
                self.echo(line)
            return
        # Piped: print the table only when a job's size, target or state changed.
        key = [" ".join(line.split()[:9]) for line in table[1:] if not line.startswith("#")]
        if key != self._last_table:
            self._last_table = key
            self.echo(header)
            for line in table:
                self.echo("    " + line)

    # ------------------------------------------------------------------ clean stop

    def _cancel_demo_jobs(self) -> None:
        """Cancel every demo job still active and every companion of one; wait (bounded)."""
        ours = set(self.record.jobs)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                jobs = self.backend.read_jobs()
            except SlurmError:
                time.sleep(1)
                continue
            left = [
                j.job_id
                for j in jobs
                if j.state.is_active and (j.job_id in ours or _companion_of(j.comment) in ours)
            ]
            if not left:
                return
            subprocess.run(["scancel", *map(str, left)], capture_output=True, timeout=30)
            time.sleep(1)
        self.echo("warning: some demo jobs were still ending after 60 s (see squeue)")


def _companion_of(comment: str) -> int | None:
    from slurm_elastic.marker import companion_parent

    return companion_parent(comment)


def history_states(backend: CliBackend, since: float, job_ids: set[int]) -> dict[int, Any]:
    """sacct's final record of each job (state, start, end), retried while sacct lags."""
    deadline = time.monotonic() + 15
    found: dict[int, Any] = {}
    while time.monotonic() < deadline:
        try:
            found = {h.job_id: h for h in backend.read_history(since - 60) if h.job_id in job_ids}
        except SlurmError:
            found = {}
        if len(found) == len(job_ids) and all(
            h.state.is_finished and h.end_time for h in found.values()
        ):
            break
        time.sleep(1)
    return found
