"""The daemon as a service: the loop around ``Controller.run_once``, systemd notification,
signals, the API server, the status document and metrics.

Threads: the loop runs in the main thread; the HTTP API serves from its own threads and
meets the loop only in the thread-safe ReportStore / InstructionBoard and in the last
published status document.  systemd is told ``READY=1``, ``STATUS=`` and ``WATCHDOG=1`` from
the loop itself after each finished cycle, never from a side thread, so a wedged cycle
stops the watchdog pings and systemd restarts the daemon.

Signals only set flags (and wake the loop through ``signal.set_wakeup_fd``): SIGTERM/SIGINT
finish the current cycle, send ``STOPPING=1`` and exit 0; SIGHUP reloads the configuration
between cycles, and a bad new configuration keeps the old one (``config.reload_failed``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import select
import signal
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from slurm_elastic.actuate.instructions import InstructionBoard
from slurm_elastic.actuate.journal import Journal
from slurm_elastic.config import Config, flat_items, load_config, load_main
from slurm_elastic.daemon.api import ApiContext, ApiServer
from slurm_elastic.daemon.controller import Controller, CycleResult
from slurm_elastic.daemon.exitcodes import ExitCode
from slurm_elastic.daemon.metrics import DaemonMetrics
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.daemon.status import (
    STATUS_FILE,
    CycleContent,
    CycleInfo,
    DaemonInfo,
    build_document,
    write_atomic,
)
from slurm_elastic.daemon.visibility import Privacy
from slurm_elastic.errors import ConfigError, StateError
from slurm_elastic.logs import configure_logging
from slurm_elastic.policy.mip import quiet_solver_banner
from slurm_elastic.slurm.backend import SlurmBackend
from slurm_elastic.terminal import safe_text
from slurm_elastic.types import ClusterSnapshot, ProgressReport

log = structlog.get_logger("slurm_elastic.service")

# Config keys read once at start-up: a reload cannot move a bound socket or a journal.
RESTART_KEYS = ("state_dir", "api.bind", "api.port", "slurm.backend")


# --------------------------------------------------------------------------- sd_notify


class Notifier:
    """sd_notify(3) by hand: one datagram per message to ``$NOTIFY_SOCKET``.

    Not under systemd (no ``NOTIFY_SOCKET``) every call is a no-op.  The variable is removed
    from the environment so that Slurm clients and other children never inherit it.
    """

    def __init__(self, address: str | None = None) -> None:
        if address is None:
            address = os.environ.pop("NOTIFY_SOCKET", None)
        if address and address.startswith("@"):
            address = "\0" + address[1:]  # Linux abstract socket
        self._address = address or None
        self._warned = False

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, *lines: str) -> bool:
        if self._address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto("\n".join(lines).encode(), self._address)
        except OSError as exc:
            if not self._warned:  # once: a broken socket must not flood the log
                log.warning("sd_notify.failed", error=str(exc))
                self._warned = True
            return False
        return True


def status_line(text: str, limit: int = 400) -> str:
    """``STATUS=`` with one line of text: a newline in an error would start a new assignment,
    and ``systemctl status`` shows the rest to the admin (user-written text escaped)."""
    return "STATUS=" + safe_text(" ".join(text.split()))[:limit]


def watchdog_interval_s(environ: dict[str, str] | None = None) -> float | None:
    """``WatchdogSec`` as systemd passes it (``$WATCHDOG_USEC``), for this process only."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1e6
    except ValueError:
        return None


# --------------------------------------------------------------------------- wiring


class SnapshotTap:
    """Delegates to a backend and keeps the latest snapshot: the API's job -> owner map.

    The API answers from it without calling Slurm, so that reports cost no Slurm calls.
    """

    def __init__(self, backend: SlurmBackend) -> None:
        self._backend = backend
        self.latest: ClusterSnapshot | None = None

    def read_cluster(self, now: float | None = None) -> ClusterSnapshot:
        snapshot = self._backend.read_cluster(now)
        self.latest = snapshot
        return snapshot

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def owner_of(self, job_id: int) -> int | None:
        snapshot = self.latest
        if snapshot is None:
            return None
        for job in snapshot.jobs:
            if job.job_id == job_id:
                if job.user_id is not None:
                    return job.user_id
                try:
                    return pwd.getpwnam(job.user).pw_uid
                except KeyError:
                    return None
        return None


def make_backend(config: Config, *, dry_run: bool = False) -> SlurmBackend:
    """The configured backend (``slurm.backend``: auto | cli | pyslurm), via the one selector."""
    from slurm_elastic.slurm.select import make_backend as select_backend

    return select_backend(
        config.slurm.backend,
        dry_run=dry_run,
        timeout_s=config.slurm.timeout_s,
        pyslurm_path=config.slurm.pyslurm_path,
    )


def content_of(
    result: CycleResult,
    reports: ReportStore,
    reclaims: Sequence[dict[str, Any]] = (),
    measured: Callable[[int], Sequence[tuple[int, float]]] = lambda _job: (),
) -> CycleContent:
    """The cycle's wire form, each job row with its latest progress report (if any), the
    time its resizes saved it so far (``reports.Tally``) and the rates measured at each
    size (``measured``: the estimator's); ``reclaims``: the latest loans given back, this
    cycle's included."""
    wire = result.to_json()
    jobs = []
    for row in wire["jobs"]:
        job_id = int(row["job_id"])
        row = with_progress(row, reports.latest(job_id), reports.saved_s(job_id))
        rates = [{"nodes": n, "steps_per_s": rate} for n, rate in measured(job_id)]
        jobs.append({**row, "measured": rates})
    return CycleContent(
        jobs=tuple(jobs),
        plan=wire["plan"],
        actions=tuple(wire["actions"]),
        extra={
            "nodes_on_loan": wire["nodes_on_loan"],
            "reclaims": list(reclaims),
            "gpu_types": wire["gpu_types"],
        },
    )


def with_progress(
    row: dict[str, Any], report: ProgressReport | None, saved_s: float | None = None
) -> dict[str, Any]:
    if report is None:
        return {
            **row,
            "step": None,
            "samples_per_s": None,
            "reported_at": None,
            "saved_s": None,
            "fallback": None,
        }
    return {
        **row,
        "step": report.step,
        "samples_per_s": report.samples_per_s,
        "reported_at": report.time,
        "saved_s": None if saved_s is None else round(saved_s, 1),
        "fallback": report.fallback,
    }


def health_window_s(config: Config) -> float:
    # Three missed periods, plus one Slurm timeout a slow cycle may legitimately spend.
    return 3 * config.interval_s + config.slurm.timeout_s


def changed_keys(old: Config, new: Config) -> list[str]:
    before = dict(flat_items(old.plain()))
    return [key for key, value in flat_items(new.plain()) if before.get(key) != value]


RECENT_RECLAIMS = 20  # loans given back that the status document lists


@dataclass
class _LoopState:
    """What the loop keeps between cycles for the status document and systemd."""

    count: int = 0
    last_ok_at: float | None = None
    last_error: str | None = None
    last_cycle_ok: bool | None = None  # None: no cycle has finished yet
    ready_sent: bool = False
    content: CycleContent = field(default_factory=CycleContent)
    document: dict[str, Any] | None = None
    # The latest loans given back, newest last, for the status document.
    reclaims: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT_RECLAIMS))


class Service:
    """The daemon: the control loop, the HTTP API, SIGHUP reloads, systemd notification."""

    def __init__(
        self,
        config: Config,
        loader: Callable[[], Config] | None = None,
        *,
        backend: SlurmBackend | None = None,
        notifier: Notifier | None = None,
        clock: Callable[[], float] = time.time,
        serve_api: bool = True,
    ) -> None:
        self.config = config
        # How SIGHUP re-reads the configuration (same files, same rules as at start-up).
        self.loader = loader if loader is not None else load_config
        self.clock = clock
        self.notifier = notifier if notifier is not None else Notifier()
        self.metrics = DaemonMetrics()
        self.reports = ReportStore()
        self.board = InstructionBoard()
        self.state_dir = Path(config.state_dir)
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(
                f"{self.state_dir}: cannot create the state directory (state_dir): {exc.strerror}"
            ) from None
        # After the cheap local checks, so a start-up error stays one line.
        self.tap = SnapshotTap(backend if backend is not None else make_backend(config))
        self.journal = Journal.in_state_dir(self.state_dir)
        self.controller = Controller(
            self.tap, config, reports=self.reports, journal=self.journal, agents=self.board
        )
        self.started_at = clock()
        self._state = _LoopState()
        self._stop = False
        self._reload = False
        # Set from the API thread (an ack arrived); the loop then cycles without waiting.
        self._cycle_now = threading.Event()
        self._wake_w: socket.socket | None = None
        self.api: ApiServer | None = None
        self._privacy = Privacy.unknown()
        # Before the API threads exist (see quiet_solver_banner): stdout carries no banner.
        quiet_solver_banner()
        if serve_api:
            context = ApiContext(
                reports=self.reports,
                board=self.board,
                metrics=self.metrics,
                owner_of=self.tap.owner_of,
                size_of=self.controller.size_of,
                status_document=lambda: self._state.document,
                health=self.health,
                clock=clock,
                unmunge=config.api.unmunge,
                on_ack=self.request_cycle,
                privacy=self.privacy,
            )
            try:
                self.api = ApiServer(context, config.api.bind, config.api.port)
            except OSError as exc:
                self.journal.close()
                where = f"{config.api.bind}:{config.api.port}"
                raise ConfigError(f"api.port: cannot listen on {where}: {exc.strerror}") from None

    # ------------------------------------------------------------------ health/status

    def health(self, now: float) -> tuple[bool, str]:
        last = self._state.last_ok_at
        if last is None:
            return False, self._state.last_error or "no cycle has completed yet"
        age = now - last
        window = health_window_s(self.config)
        if age > window:
            why = self._state.last_error or "no cycle since"
            return False, f"last good cycle {age:.0f}s ago (> {window:.0f}s): {why}"
        return True, f"last good cycle {age:.1f}s ago"

    @property
    def status_document(self) -> dict[str, Any] | None:
        return self._state.document

    def privacy(self) -> Privacy:
        """What Slurm keeps private (PrivateData): unknown, so as private as can be, until
        the controller's probe has answered (``_learn_privacy``)."""
        return self._privacy

    def _learn_privacy(self) -> None:
        """Ask the controller's probe (one each start and reload) what Slurm keeps private;
        a probe that fails leaves it unknown and is asked again after the next good cycle."""
        caps = self.controller.capabilities()
        if caps is not None:
            self._privacy = Privacy.of(caps.private_data, caps.slurm_user, caps.admins)

    # ------------------------------------------------------------------ the loop

    def run(self, *, once: bool = False) -> int:
        """Run until SIGTERM/SIGINT (or one cycle with ``once``); returns the exit status.

        A fault of the journal (``StateError``: disk full, read-only, corrupt) ends the loop
        by raising it: the CLI prints its one line and exits ``ExitCode.STATE``.

        The loop exits 0 when asked to stop: a failed cycle is the service's normal life
        (it says why in STATUS= and /healthz) and a non-zero exit would make systemd restart
        it.  ``once`` is what a script or a timer runs, and there the one cycle *is* the
        result, so its failure is ``ExitCode.CYCLE_FAILED``.
        """
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        self._wake_w = wake_w
        previous = self._install_signals(wake_w)
        log.info(
            "daemon.starting",
            pid=os.getpid(),
            mode=self.config.mode,
            policy=self.config.policy.name,
            interval_s=self.config.interval_s,
            config_files=list(self.config.files),
        )
        self._check_watchdog()
        try:
            if self.api is not None:
                self.api.start()
            next_at = self.clock()
            while not self._stop:
                self._one_cycle()
                if once:
                    break
                next_at = max(next_at + self.config.interval_s, self.clock())
                self._wait_until(next_at, wake_r)
                if self._cycle_now.is_set():
                    self._cycle_now.clear()
                    next_at = self.clock()  # the regular ticks restart from this cycle
                if self._reload:
                    self._reload = False
                    self.reload()
        finally:
            self.notifier.notify("STOPPING=1", "STATUS=stopping")
            log.info("daemon.stopping", cycles=self._state.count)
            if self.api is not None:
                self.api.stop()
            self.journal.close()
            self._restore_signals(previous)
            wake_r.close()
            wake_w.close()
        if once and self._state.last_cycle_ok is False:
            return ExitCode.CYCLE_FAILED
        return ExitCode.OK

    def _one_cycle(self) -> None:
        started = self.clock()
        state = self._state
        state.count += 1
        result: CycleResult | None = None
        error_kind: str | None = None
        try:
            result = self.controller.run_once(started)
        except StateError:
            # The journal cannot be written (or trusted): acting on would break the promise
            # that every action is written down first.  Stop; a restart reconciles.
            raise
        except Exception as exc:  # a bug in one cycle must not end the service
            log.exception("cycle.failed", cycle=state.count, error=str(exc))
            state.last_error = f"{type(exc).__name__}: {exc}"
            error_kind = type(exc).__name__
        finished = self.clock()
        ok = result is not None and result.ok
        state.last_cycle_ok = ok
        if result is not None and result.ok:
            state.last_ok_at = finished
            state.last_error = None
            state.reclaims.extend(r.to_json() for r in result.reclaims)
            state.content = content_of(
                result, self.reports, state.reclaims, self.controller.estimator.measured_rates
            )
            self._log_applied(result)
        elif result is not None:
            state.last_error = result.error
            error_kind = result.error_kind
        info = CycleInfo(
            count=state.count,
            ok=ok,
            started_at=started,
            finished_at=finished,
            error=None if ok else state.last_error,
            slurm_calls=result.slurm_calls + result.history_calls if result else 0,
            last_ok_at=state.last_ok_at,
        )
        try:
            self._publish(info, result, error_kind)
        except Exception as exc:  # publishing must not end the service either
            log.exception("status.publish_failed", cycle=state.count, error=str(exc))
        self._notify_systemd(info)

    def _publish(self, info: CycleInfo, result: CycleResult | None, error_kind: str | None) -> None:
        state = self._state
        daemon = DaemonInfo(
            pid=os.getpid(),
            started_at=self.started_at,
            mode=self.config.mode,
            policy=self.config.policy.name,
            interval_s=self.config.interval_s,
            config_files=self.config.files,
        )
        state.document = build_document(info.finished_at, daemon, info, state.content)
        if info.ok and not self._privacy.known:
            self._learn_privacy()
        try:
            # Readable by anyone only when Slurm hides nothing the document shows.
            private = self._privacy.hides_anything
            write_atomic(self.state_dir / STATUS_FILE, state.document, private=private)
        except OSError as exc:
            log.warning(
                "status.write_failed", path=str(self.state_dir / STATUS_FILE), error=str(exc)
            )
        rows = state.content.jobs if info.ok else ()
        plan = result.plan if result is not None and result.ok else None
        self.metrics.record_cycle(
            ok=info.ok,
            duration_s=info.duration_s,
            finished_at=info.finished_at,
            slurm_calls=info.slurm_calls,
            jobs_by_state=Counter(str(r["state"]) for r in rows) if info.ok else None,
            elastic_jobs=sum(1 for r in rows if r.get("min") is not None) if info.ok else None,
            applied_kinds=[str(r.action.kind) for r in result.applied] if result else (),
            plan_objective=plan.objective if plan is not None else None,
            plan_solve_s=plan.solve_s if plan is not None else None,
            error_kind=error_kind,
            nodes_on_loan=result.nodes_on_loan if result is not None and result.ok else None,
            reclaim_seconds=[r.seconds for r in result.reclaims] if result is not None else (),
        )

    def _notify_systemd(self, info: CycleInfo) -> None:
        # READY after the first finished cycle even when it failed (Slurm down at boot): the
        # service is up and says why in STATUS= and /healthz; a failed start would hide that.
        if info.ok:
            status = (
                f"STATUS=cycle {info.count} ok in {info.duration_s:.2f}s, mode {self.config.mode}"
            )
        else:
            status = status_line(f"cycle {info.count} failed: {info.error}")
        lines = [status, "WATCHDOG=1"]
        if not self._state.ready_sent:
            lines.insert(0, "READY=1")
            self._state.ready_sent = True
        self.notifier.notify(*lines)

    def _log_applied(self, result: CycleResult) -> None:
        for reclaim in result.reclaims:
            log.info("reclaim.done", **reclaim.to_json())
        for record in result.applied:
            a = record.action
            log.info(
                "resize.applied",
                job_id=a.job_id,
                kind=str(a.kind),
                from_nodes=a.from_nodes,
                to_nodes=a.to_nodes,
                detail=record.detail,
                action_id=record.action_id,
            )

    # ------------------------------------------------------------------ reload

    def reload(self) -> bool:
        """SIGHUP: load the config files again; a bad config keeps the running one."""
        try:
            new = self.loader()
        except ConfigError as exc:
            log.error("config.reload_failed", error=str(exc), kept="previous configuration")
            self.notifier.notify(status_line(f"config reload failed, kept the old one: {exc}"))
            return False
        changed = changed_keys(self.config, new)
        needs_restart = [k for k in changed if k in RESTART_KEYS]
        if needs_restart:
            # Keep the values that cannot change in place, and say so.
            new = new.model_copy(
                update={
                    "state_dir": self.config.state_dir,
                    "api": self.config.api,
                    "slurm": new.slurm.model_copy(update={"backend": self.config.slurm.backend}),
                }
            )
        self.config = new
        self.controller.reconfigure(new)
        # An operator who reloads us may have changed Slurm too (PrivateData, admins): ask
        # again after the next good cycle, as private as can be until then.
        self.controller.forget_capabilities()
        self._privacy = Privacy.unknown()
        configure_logging(new.log.level, new.log.json_)
        log.info("config.reloaded", changed=changed, needs_restart=needs_restart)
        return True

    # ------------------------------------------------------------------ plumbing

    def request_cycle(self) -> None:
        """Run the next cycle now (thread-safe; the API calls it when a job acknowledges)."""
        self._cycle_now.set()
        if self._wake_w is not None:
            with contextlib.suppress(BlockingIOError, OSError):
                self._wake_w.send(b"\0")

    def _wait_until(self, deadline: float, wake: socket.socket) -> None:
        while not self._stop and not self._reload and not self._cycle_now.is_set():
            remaining = deadline - self.clock()
            if remaining <= 0:
                return
            ready, _, _ = select.select([wake], [], [], remaining)
            if ready:
                with contextlib.suppress(BlockingIOError):
                    wake.recv(64)

    def _install_signals(self, wake: socket.socket) -> dict[int, Any]:
        def on_stop(signum: int, frame: object) -> None:
            self._stop = True

        def on_hup(signum: int, frame: object) -> None:
            self._reload = True

        previous: dict[int, Any] = {}
        for sig, handler in (
            (signal.SIGTERM, on_stop),
            (signal.SIGINT, on_stop),
            (signal.SIGHUP, on_hup),
        ):
            previous[sig] = signal.signal(sig, handler)
        previous[-1] = signal.set_wakeup_fd(wake.fileno(), warn_on_full_buffer=False)
        return previous

    @staticmethod
    def _restore_signals(previous: dict[int, Any]) -> None:
        signal.set_wakeup_fd(previous.pop(-1))
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def _check_watchdog(self) -> None:
        watchdog = watchdog_interval_s()
        if watchdog is not None and self.config.interval_s * 2 > watchdog:
            log.warning(
                "daemon.watchdog_too_short",
                watchdog_s=watchdog,
                interval_s=self.config.interval_s,
                hint="WatchdogSec should be at least twice interval_s plus a slow cycle",
            )


def run_daemon(config_file: Path | None, *, once: bool = False) -> int:
    """Entry point of ``slurm-elastic daemon``: load config, configure logs, run the loop."""
    config = load_main(config_file)
    configure_logging(config.log.level, config.log.json_)
    # Start-up errors (ConfigError, OSError) reach the CLI, which prints them as one line.
    service = Service(config, functools.partial(load_main, config_file))
    return service.run(once=once)
