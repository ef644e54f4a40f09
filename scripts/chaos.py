#!/usr/bin/env python3
"""Chaos run: the real daemon, SIGKILLed again and again while it resizes real jobs.

On one local cluster (``scripts/cluster.sh``; 4 nodes) the daemon runs in ``enforce``
mode under a workload that keeps it starting jobs at size, shrinking and growing: elastic
jobs training ``examples/train_mlp.py`` under ``slurm-elastic run`` (half stop-free with
torchft, half checkpoint-and-restart with torchrun) and rigid ``sleep`` jobs, arriving at
random.  While it works, the daemon is killed with SIGKILL ``--kills`` times and restarted
at once.  The kills come in three kinds, in a shuffled order:

* ``plain``: at a random moment of the loop;
* ``before``: inside an action, after the journal committed its intent and before the
  Slurm call (the daemon runs with a backend that stops there; ``chaos.py daemon``);
* ``after``: inside an action, after Slurm accepted the call and before the journal
  recorded the outcome.

One ``before`` kill also tears the journal's last write (the tail of SQLite's write-ahead
log is cut, as a kill in the middle of that commit would leave it), and once slurmctld is
stopped for ``--outage-s`` seconds while the daemon runs, then started again.

At the end (every job done, the daemon left alone for a few cycles, then stopped with
SIGTERM) the run checks, from what it saw of Slurm once a second, Slurm's accounting and
the daemon's journal:

* ``repeated``: a grow that put two companion jobs in Slurm, or the same resize (job,
  kind, from, to) applied twice in a row;
* ``forgotten``: a journal row still open, a companion in Slurm the journal has no link
  for, or a shrink seen in Slurm with no applied shrink in the journal;
* ``orphans``: a companion still queued or running ``--orphan-grace-s`` past the daemon's
  own ``grow.orphan_grace_s`` (the time a companion of a completed parent is given to end
  by itself) after its parent ended while the daemon was up all that time, or any left at
  the end;
* ``below_min``: an elastic job seen running below its minimum or without its batch host;
* ``unmarked_touched``: a rigid job the journal names, or that Slurm shows pinned,
  resized or with more than one allocation;
* ``jobs_completed``: workload jobs whose accounting state is COMPLETED, of all submitted.

Last line: ``kills=… resizes=… repeated=0 forgotten=0 orphans=0 below_min=0
unmarked_touched=0 jobs_completed=…/…`` followed by the kill kinds and the run's length.
Exit status 0 only when every count is 0 and every job completed.

    python scripts/chaos.py --kills 20 [--slurm 22.05] [--instance 5] [--seed 1]

``tests/test_chaos.py`` runs a short one (4 kills) on the default Slurm version.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from a clone
    sys.path.insert(0, str(REPO))

from slurm_elastic.actuate.journal import ActionStatus, Journal  # noqa: E402
from slurm_elastic.demo import harness  # noqa: E402
from slurm_elastic.demo.session import history_states  # noqa: E402
from slurm_elastic.demo.workload import DemoJob  # noqa: E402
from slurm_elastic.errors import SlurmError  # noqa: E402
from slurm_elastic.marker import companion_parent  # noqa: E402
from slurm_elastic.slurm.cli import CliBackend  # noqa: E402
from slurm_elastic.types import ActionKind, ClusterSnapshot, JobState, JobView  # noqa: E402

KILL_KINDS = ("plain", "before", "after")
# The backend calls that change a job in Slurm: where ``before``/``after`` kills land.
ACTIONS = ("pin_pending_size", "shrink", "submit", "cancel", "requeue")
RESIZE_KINDS = (ActionKind.START_AT_SIZE, ActionKind.SHRINK, ActionKind.GROW)
STALL_FILE = "stalled"
DAEMON_ORPHAN_GRACE_S = 10.0  # the run's grow.orphan_grace_s (the default is 30 s)
INTERVAL_S = 2


# --------------------------------------------------------------------------- the daemon side


class StallingBackend:
    """A real backend that stops inside the first action call, so the run can kill there.

    ``where`` is ``before`` (the journal holds the intent; Slurm was not called) or
    ``after`` (Slurm accepted the call; the journal has not recorded it).  It writes the
    call's name to ``flag`` and sleeps until it is killed.  Reads pass through untouched.
    """

    def __init__(self, inner: Any, where: str, flag: Path) -> None:
        self._inner = inner
        self._where = where
        self._flag = flag

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in ACTIONS:
            return attr
        return functools.partial(self._act, name, attr)

    def _act(self, name: str, call: Any, /, *args: Any, **kwargs: Any) -> Any:
        if self._where == "before":
            self._stall(name)
        result = call(*args, **kwargs)
        if self._where == "after":
            self._stall(name)
        return result

    def _stall(self, name: str) -> None:
        self._flag.write_text(name)
        while True:
            time.sleep(3600)


def run_daemon(config_file: Path, stall: str | None) -> int:
    """``slurm-elastic daemon`` as the CLI runs it, with the stalling backend if asked."""
    from slurm_elastic.config import load_main
    from slurm_elastic.daemon.service import Service, make_backend
    from slurm_elastic.logs import configure_logging

    config = load_main(config_file)
    configure_logging(config.log.level, config.log.json_)
    backend = None
    if stall is not None:
        flag = Path(config.state_dir) / STALL_FILE
        backend = StallingBackend(make_backend(config), stall, flag)
    service = Service(config, functools.partial(load_main, config_file), backend=backend)
    return service.run()


# --------------------------------------------------------------------------- the workload


def random_job(rng: random.Random, index: int, scale: float = 1.0) -> DemoJob:
    """An elastic MLP job (1.5 to 3 minutes of training at one node) or a rigid sleep
    (15 to 50 s); ``scale`` shortens or lengthens both."""
    if rng.random() < 0.35:
        nodes = rng.choice((1, 1, 2))
        sleep_s = max(5, round(rng.randint(15, 50) * scale))
        return DemoJob(f"rigid-{index}", 0, nodes, nodes, False, sleep_s=sleep_s)
    low, high = rng.choice(((1, 3), (1, 3), (1, 2), (2, 4), (1, 4)))
    args = {
        "--samples": max(480, round(2400 * scale / 48) * 48),
        "--epochs": rng.choice((3, 4, 5)),
        "--global-batch": 48,
        "--micro-batch": 16,
        "--sample-sleep": 0.012,
        "--seed": index,
        "--report-every": 2,
        "--checkpoint-every": 10,
    }
    train = tuple(item for key, value in args.items() for item in (key, str(value)))
    return DemoJob(f"mlp-{index}", 0, low, high, True, train)


@dataclasses.dataclass
class Submitted:
    job: DemoJob
    mode: str
    submitted_at: float


# --------------------------------------------------------------------------- observation


@dataclasses.dataclass
class Findings:
    """What the run saw go wrong, each with a short description (the counts are lengths)."""

    repeated: list[str] = dataclasses.field(default_factory=list)
    forgotten: list[str] = dataclasses.field(default_factory=list)
    orphans: list[str] = dataclasses.field(default_factory=list)
    below_min: list[str] = dataclasses.field(default_factory=list)
    unmarked_touched: list[str] = dataclasses.field(default_factory=list)

    def add(self, what: str, text: str) -> None:
        bucket: list[str] = getattr(self, what)
        if text not in bucket:
            bucket.append(text)
            print(f"chaos: FINDING {what}: {text}", flush=True)


class Watcher:
    """Folds each poll of the queue into the run's findings (a poll is one squeue read)."""

    def __init__(self, workload: dict[int, Submitted], findings: Findings, grace_s: float) -> None:
        self.workload = workload
        self.findings = findings
        self.grace_s = grace_s
        self.companions: dict[int, int] = {}  # companion id -> parent id, as seen in Slurm
        self.parent_gone_at: dict[int, float] = {}
        self.own_size: dict[int, int] = {}  # running parent -> its own node count last seen
        self.shrinks_seen: list[tuple[int, int, int, float]] = []  # job, from, to, when

    def poll(self, snap: ClusterSnapshot, now: float, daemon_up_since: float | None) -> None:
        active = {j.job_id: j for j in snap.jobs if j.state.is_active}
        for job in active.values():
            parent = companion_parent(job.comment)
            if parent is not None:
                self.companions[job.job_id] = parent
        for job_id in self.workload:
            if job_id not in active and job_id not in self.parent_gone_at:
                self.parent_gone_at[job_id] = now
        for job in active.values():
            sub = self.workload.get(job.job_id)
            if sub is not None and sub.job.elastic:
                self._elastic(job, sub.job, active, now)
            elif sub is not None:
                self._rigid(job, sub.job)
            elif job.job_id in self.companions:
                self._companion(job, now, daemon_up_since)

    def _elastic(self, job: JobView, spec: DemoJob, active: dict[int, JobView], now: float) -> None:
        if job.state is not JobState.RUNNING:
            return
        extra = sum(
            c.node_count
            for cid, c in active.items()
            if self.companions.get(cid) == job.job_id and c.state is JobState.RUNNING
        )
        if job.node_count + extra < spec.min_nodes:
            self.findings.add(
                "below_min", f"job {job.job_id} ran on {job.node_count}+{extra} < {spec.min_nodes}"
            )
        if job.batch_host is not None and job.nodes and job.batch_host not in job.nodes:
            self.findings.add("below_min", f"job {job.job_id} lost its batch host {job.batch_host}")
        before = self.own_size.get(job.job_id)
        if before is not None and job.node_count < before:
            self.shrinks_seen.append((job.job_id, before, job.node_count, now))
        self.own_size[job.job_id] = job.node_count

    def _rigid(self, job: JobView, spec: DemoJob) -> None:
        if job.state is JobState.RUNNING and job.node_count != spec.min_nodes:
            self.findings.add(
                "unmarked_touched", f"rigid job {job.job_id} ran on {job.node_count} nodes"
            )
        if job.state is JobState.PENDING and job.min_nodes != spec.min_nodes:
            self.findings.add(
                "unmarked_touched", f"rigid job {job.job_id} pending with min {job.min_nodes}"
            )

    def _companion(self, job: JobView, now: float, daemon_up_since: float | None) -> None:
        parent = self.companions[job.job_id]
        gone = self.parent_gone_at.get(parent)
        if gone is None or daemon_up_since is None:
            return
        since = max(gone, daemon_up_since)
        if now - since > self.grace_s:
            self.findings.add(
                "orphans",
                f"companion {job.job_id} of {parent} still {job.state.value} "
                f"{now - gone:.0f}s after its parent ended",
            )


def check_journal(
    state_dir: Path, workload: dict[int, Submitted], watcher: Watcher, findings: Findings
) -> int:
    """The journal's side of the verdict (run with the daemon stopped); returns the number
    of applied resizes (start-at-size, shrink, grow)."""
    journal = Journal.in_state_dir(state_dir)
    try:
        actions = journal.all_actions()
        links = journal.companions(active_only=False)
    finally:
        journal.close()
    for entry in actions:
        if entry.status.is_open:
            findings.add(
                "forgotten", f"action {entry.id} ({entry.action.kind}) left {entry.status}"
            )
        sub = workload.get(entry.job_id)
        if sub is not None and not sub.job.elastic:
            findings.add("unmarked_touched", f"action {entry.id} on rigid job {entry.job_id}")
    linked = {link.companion_id for link in links}
    for companion, parent in watcher.companions.items():
        if companion not in linked:
            findings.add("forgotten", f"companion {companion} of {parent} has no journal link")
    per_action = Counter(link.action_id for link in links if link.action_id is not None)
    for action_id, count in per_action.items():
        if count > 1:
            findings.add("repeated", f"grow {action_id} has {count} companions")
    last: dict[int, tuple[ActionKind, int, int]] = {}
    for entry in actions:
        if entry.status is not ActionStatus.APPLIED:
            continue
        key = (entry.action.kind, entry.action.from_nodes, entry.action.to_nodes)
        if entry.action.kind in RESIZE_KINDS and last.get(entry.job_id) == key:
            findings.add(
                "repeated", f"{key[0]} {key[1]}->{key[2]} of job {entry.job_id} applied twice"
            )
        last[entry.job_id] = key
    shrunk = {
        e.job_id
        for e in actions
        if e.action.kind is ActionKind.SHRINK and e.status is ActionStatus.APPLIED
    }
    for job_id, before, after, _ in watcher.shrinks_seen:
        if job_id not in shrunk:
            findings.add(
                "forgotten", f"job {job_id} shrank {before}->{after} with no applied shrink"
            )
    return sum(
        1 for e in actions if e.status is ActionStatus.APPLIED and e.action.kind in RESIZE_KINDS
    )


# --------------------------------------------------------------------------- the run


class Chaos:
    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.rng = random.Random(opts.seed)
        self.out: Path = opts.out.resolve()
        self.state = self.out / "state"
        self.jobs_dir = self.out / "jobs"
        self.backend = CliBackend(timeout_s=20)
        self.findings = Findings()
        self.workload: dict[int, Submitted] = {}
        # The daemon leaves a companion of a completed parent DAEMON_ORPHAN_GRACE_S to end
        # by itself (grow.orphan_grace_s): only what it lets run past that is a finding.
        grace = DAEMON_ORPHAN_GRACE_S + opts.orphan_grace_s
        self.watcher = Watcher(self.workload, self.findings, grace)
        self.daemon: harness.Daemon | None = None
        self.daemon_stall: str | None = None
        self.daemon_up_since: float | None = None
        self.kinds_done: Counter[str] = Counter()
        self.torn = 0
        self.outages = 0
        self.exits: list[str] = []  # the daemon ending on its own: never expected
        self.arrivals = 0
        self.next_arrival = time.monotonic()
        self.api = ""

    # ------------------------------------------------------------------ set-up

    def prepare(self) -> None:
        shutil.rmtree(self.out, ignore_errors=True)
        self.jobs_dir.mkdir(parents=True)
        line = harness.cluster_up(self.opts.slurm, self.opts.instance)
        print(f"chaos: {line}", flush=True)
        snap = self.backend.read_cluster()
        busy = [j.job_id for j in snap.jobs if j.state.is_active]
        if busy:
            raise SystemExit(
                f"chaos: cluster instance {self.opts.instance} has active jobs {busy[:5]}: "
                "it needs the cluster to itself"
            )
        subprocess.run(["scontrol", "reconfigure"], capture_output=True, timeout=30, check=False)
        port = harness.free_port()
        self.api = f"http://127.0.0.1:{port}"
        # The demo's config with a faster loop, shorter guards, and the journal's closed rows
        # kept for the whole run (they are kept for sacct_lookback_s): the verdict reads them.
        self.config, _ = harness.write_config(
            self.out,
            port,
            quick=True,
            overrides={
                "interval_s": INTERVAL_S,
                "slurm": {"sacct_interval_s": 60, "sacct_lookback_s": 7200, "timeout_s": 10},
                "guards": {"cooldown_s": 6, "min_dwell_s": 6, "payback_horizon_s": 60},
                "model": {"default_resize_cost_s": 5},
                "grow": {"orphan_grace_s": DAEMON_ORPHAN_GRACE_S},
            },
        )

    def kill_plan(self) -> list[str]:
        """``--kills`` kinds: a third before, a third after, the rest plain; shuffled."""
        n = self.opts.kills
        kinds = ["before"] * (n // 3) + ["after"] * (n // 3)
        kinds += ["plain"] * (n - len(kinds))
        self.rng.shuffle(kinds)
        return kinds

    # ------------------------------------------------------------------ the daemon

    def start_daemon(self, stall: str | None) -> None:
        (self.state / STALL_FILE).unlink(missing_ok=True)
        argv = [sys.executable, __file__, "daemon", "--config", str(self.config)]
        if stall is not None:
            argv += ["--stall", stall]
        self.daemon = harness.Daemon(self.config, self.out / "daemon.log", self.jobs_dir, argv)
        self.daemon.start()
        self.daemon_stall = stall
        self.daemon_up_since = time.time()

    def kill_daemon(self) -> None:
        if self.daemon is not None:
            self.daemon.kill()
        self.daemon_up_since = None

    def stop_daemon(self) -> int | None:
        self.daemon_up_since = None
        return self.daemon.stop(timeout_s=60) if self.daemon is not None else None

    def stalled(self) -> str | None:
        try:
            return (self.state / STALL_FILE).read_text() or None
        except OSError:
            return None

    def tear_journal(self) -> bool:
        """Cut the tail of the WAL's last frame: the kill came in the middle of that commit
        (done only after a ``before`` kill, whose last commit is an intent not acted on)."""
        wal = self.state / "journal.sqlite-wal"
        try:
            size = wal.stat().st_size
        except OSError:
            return False
        if size < 64:
            return False
        os.truncate(wal, size - 7)
        return True

    # ------------------------------------------------------------------ slurmctld outage

    def outage(self) -> None:
        """slurmctld stopped for ``--outage-s`` while the daemon runs, then started again."""
        conf = Path(os.environ["SLURM_CONF"])
        pid_file = next(
            Path(line.split("=", 1)[1].strip())
            for line in conf.read_text().splitlines()
            if line.startswith("SlurmctldPidFile=")
        )
        pid = int(pid_file.read_text().splitlines()[0])
        print(f"chaos: stopping slurmctld (pid {pid}) for {self.opts.outage_s:.0f}s", flush=True)
        os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + self.opts.outage_s
        while time.monotonic() < end:
            time.sleep(1)
        argv = ["bash", str(harness.CLUSTER_SH), "up", "--slurm", self.opts.slurm]
        subprocess.run(
            [*argv, "--instance", str(self.opts.instance)],
            check=True,
            timeout=180,
            capture_output=True,
        )
        self.outages += 1
        print("chaos: slurmctld is back", flush=True)

    # ------------------------------------------------------------------ workload

    def submit(self, job: DemoJob, mode: str) -> None:
        work = self.jobs_dir / job.name
        try:
            job_id = harness.submit_job(
                job, work, api=self.api, submit_dir=self.jobs_dir, mode=mode
            )
        except SlurmError as exc:
            print(f"chaos: {exc}", flush=True)
            return
        self.workload[job_id] = Submitted(job, mode, time.time())
        kind = f"elastic ({mode})" if job.elastic else "rigid"
        print(f"chaos: submitted {job.name} ({job_id}) -N{job.nodes_option} {kind}", flush=True)

    def poll(self) -> ClusterSnapshot | None:
        try:
            snap = self.backend.read_cluster(time.time())
        except SlurmError:
            return None
        self.watcher.poll(snap, time.time(), self.daemon_up_since)
        return snap

    def active_workload(self, snap: ClusterSnapshot) -> int:
        return sum(1 for j in snap.jobs if j.state.is_active and j.job_id in self.workload)

    def ticks(self, seconds: float) -> Iterator[ClusterSnapshot | None]:
        """Poll once a second for ``seconds``, yielding each poll."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.monotonic()
            yield self.poll()
            time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))

    # ------------------------------------------------------------------ main loop

    def run(self) -> int:
        started = time.time()
        self.prepare()
        plan = self.kill_plan()
        outage_at = len(plan) // 2
        deadline = time.monotonic() + self.opts.time_limit_s
        try:
            for k in range(len(plan)):
                if k == outage_at and self.opts.outage_s > 0:
                    self.start_daemon(None)
                    self.work(8, None)
                    self.outage()
                    self.kill_daemon()
                kind = plan[k]
                stall = kind if kind != "plain" else None
                self.start_daemon(stall)
                wait = self.rng.uniform(5, 20) if stall is None else self.opts.stall_wait_s
                landed = self.work(min(wait, deadline - time.monotonic()), stall)
                what = self.stalled() if landed != "plain" else None
                self.kill_daemon()
                self.kinds_done[landed] += 1
                if landed != kind:
                    # No action came in time: this was a plain kill; aim the next plain one
                    # (if any is left) at the missed kind instead.
                    later = [i for i in range(k + 1, len(plan)) if plan[i] == "plain"]
                    if later:
                        plan[later[0]] = kind
                note = ""
                if landed == "before" and not self.torn and self.tear_journal():
                    self.torn = 1
                    note = ", journal torn"
                where = f" in {what}" if what else ""
                print(f"chaos: kill {k + 1}/{len(plan)} ({landed}{where}{note})", flush=True)
                if time.monotonic() > deadline:
                    break
            # The last daemon runs undisturbed until every job is done and a few cycles after.
            self.start_daemon(None)
            self.finish(deadline)
        finally:
            exit_status = self.stop_daemon()
            self.cancel_leftovers()
        return self.report(started, exit_status)

    def work(self, seconds: float, stall: str | None) -> str:
        """Poll and submit arrivals for ``seconds``; return ``stall`` as soon as the daemon
        stopped inside an action there, else ``plain``.  While a stall is armed, jobs
        arrive sooner: an arrival is what makes the policy act (start at size, shrink to
        make room, grow into nodes freed)."""
        for snap in self.ticks(seconds):
            if snap is not None and time.monotonic() >= self.next_arrival:
                limit = self.opts.max_active + (1 if stall else 0)
                if self.active_workload(snap) < limit:
                    self.arrivals += 1
                    job = random_job(self.rng, self.arrivals, self.opts.job_scale)
                    self.submit(job, ("torchft", "torchrun")[self.arrivals % 2])
                gap = (4, 10) if stall else (8, 25)
                self.next_arrival = time.monotonic() + self.rng.uniform(*gap)
            if stall is not None and self.stalled():
                return stall
            if self.daemon is not None and not self.daemon.alive():
                self.exits.append(self.daemon.tail()[:300])
                print(f"chaos: the daemon exited by itself: {self.exits[-1]}", flush=True)
                break
        return "plain"

    def finish(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            snap = self.poll()
            if snap is not None and self.active_workload(snap) == 0:
                break
            time.sleep(1)
        # Settle: companions of ended parents cancelled, open rows closed.
        for snap in self.ticks(6 * INTERVAL_S):
            if snap is None:
                continue
        for snap in self.ticks(60):
            if snap is None:
                continue
            left = [
                j for j in snap.jobs if j.state.is_active and j.job_id in self.watcher.companions
            ]
            if not left:
                break

    def cancel_leftovers(self) -> None:
        try:
            snap = self.backend.read_cluster()
        except SlurmError:
            return
        mine = set(self.workload) | set(self.watcher.companions)
        left = [str(j.job_id) for j in snap.jobs if j.state.is_active and j.job_id in mine]
        for j in snap.jobs:
            if j.state.is_active and j.job_id in self.watcher.companions:
                self.findings.add("orphans", f"companion {j.job_id} still active at the end")
        if left:
            subprocess.run(["scancel", *left], capture_output=True, timeout=30, check=False)

    # ------------------------------------------------------------------ verdict

    def check_journal(self) -> int:
        return check_journal(self.state, self.workload, self.watcher, self.findings)

    def check_accounting(self, since: float) -> int:
        """Workload jobs COMPLETED; rigid jobs with one allocation of their own size."""
        history = history_states(self.backend, since, set(self.workload))
        completed = 0
        for job_id, sub in self.workload.items():
            record = history.get(job_id)
            if record is None:
                print(f"chaos: job {job_id} ({sub.job.name}) not in accounting", flush=True)
                continue
            if record.state is JobState.COMPLETED:
                completed += 1
            else:
                print(f"chaos: job {job_id} ({sub.job.name}) ended {record.state}", flush=True)
            if not sub.job.elastic:
                sizes = [a.node_count for a in record.allocations]
                if len(sizes) > 1 or (sizes and sizes[0] != sub.job.min_nodes):
                    self.findings.add(
                        "unmarked_touched", f"rigid job {job_id} allocations {sizes} in sacct"
                    )
        return completed

    def report(self, started: float, exit_status: int | None) -> int:
        resizes = self.check_journal()
        completed = self.check_accounting(started)
        f = self.findings
        kills = sum(self.kinds_done.values())
        recovered = "journal.recovered" in (self.out / "daemon.log").read_text(errors="replace")
        counts = {
            "kills": kills,
            "resizes": resizes,
            "repeated": len(f.repeated),
            "forgotten": len(f.forgotten),
            "orphans": len(f.orphans),
            "below_min": len(f.below_min),
            "unmarked_touched": len(f.unmarked_touched),
        }
        summary = {
            **counts,
            "findings": dataclasses.asdict(f),
            "kill_kinds": dict(self.kinds_done),
            "jobs": {str(k): v.job.name for k, v in self.workload.items()},
            "daemon_last_exit": exit_status,
            "daemon_exits": self.exits,
        }
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        line = " ".join(f"{k}={v}" for k, v in counts.items())
        line += f" jobs_completed={completed}/{len(self.workload)}"
        line += " " + " ".join(f"kills_{k}={self.kinds_done[k]}" for k in KILL_KINDS)
        line += f" torn={self.torn} torn_recovered={int(recovered and bool(self.torn))}"
        line += f" outages={self.outages} daemon_exits={len(self.exits)}"
        line += f" run_s={time.time() - started:.0f}"
        print(line, flush=True)
        clean = not self.exits and all(
            v == 0 for k, v in counts.items() if k not in ("kills", "resizes")
        )
        return 0 if clean and completed == len(self.workload) and self.workload else 1


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    daemon = sub.add_parser("daemon", help="(internal) the daemon with a stalling backend")
    daemon.add_argument("--config", type=Path, required=True)
    daemon.add_argument("--stall", choices=("before", "after"))
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--slurm", default="22.05", choices=harness.SLURM_VERSIONS)
    parser.add_argument("--instance", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("/tmp/slurm-elastic-chaos"))
    parser.add_argument("--outage-s", type=float, default=45.0)
    parser.add_argument("--stall-wait-s", type=float, default=40.0)
    parser.add_argument("--orphan-grace-s", type=float, default=20.0)
    parser.add_argument("--max-active", type=int, default=5)
    parser.add_argument("--time-limit-s", type=float, default=1800.0)
    parser.add_argument("--job-scale", type=float, default=1.0, help="length of the jobs")
    opts = parser.parse_args(argv)
    if opts.command is None and opts.kills < 1:
        parser.error("--kills must be at least 1")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse(sys.argv[1:] if argv is None else argv)
    if opts.command == "daemon":
        return run_daemon(opts.config, opts.stall)
    from slurm_elastic.logs import configure_logging

    configure_logging("warning", False)  # the run's own lines only; the daemon logs to a file
    with suppress(KeyboardInterrupt):
        return Chaos(opts).run()
    return 130


if __name__ == "__main__":
    raise SystemExit(main())
