"""The service loop: sd_notify on a real unix datagram socket, signals, reload, health.

The in-process tests drive ``Service.run`` in the main thread and deliver real signals to
this process; the ``slurm``-marked test runs ``slurm-elastic daemon`` as a subprocess
against the live cluster, exactly as systemd would (NOTIFY_SOCKET, SIGHUP, SIGTERM).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_elastic.config import Config, load_config
from slurm_elastic.daemon.exitcodes import ExitCode
from slurm_elastic.daemon.service import Notifier, Service, changed_keys, watchdog_interval_s
from slurm_elastic.daemon.status import STATUS_FILE, read_document
from slurm_elastic.protocol import get_json
from slurm_elastic.types import ClusterSnapshot
from tests.fakes import RecordingBackend
from tests.test_daemon_controller_data import snapshot
from tests.test_daemon_service_process import daemon_process, wait_event, write_config


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)
    try:
        yield sock, path
    finally:
        sock.close()


def _drain(sock: socket.socket, *, until, timeout_s: float) -> list[str]:
    """Datagrams received until ``until(messages)`` holds or the time is up."""
    messages: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not until(messages):
        try:
            messages.append(sock.recv(4096).decode())
        except TimeoutError:
            continue
    return messages


def _count(messages: list[str], line: str) -> int:
    return sum(1 for m in messages if line in m.splitlines())


def test_notifier_reaches_abstract_socket() -> None:
    name = f"slurm-elastic-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert Notifier("@" + name).notify("READY=1", "STATUS=hi")
        assert sock.recv(4096) == b"READY=1\nSTATUS=hi"


def test_notifier_without_systemd_is_a_noop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = Notifier()
    assert not notifier.enabled and notifier.notify("READY=1") is False


def test_notifier_takes_socket_out_of_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/nothing-here.sock")
    notifier = Notifier()
    assert notifier.enabled and "NOTIFY_SOCKET" not in os.environ
    assert notifier.notify("WATCHDOG=1") is False  # nobody listens: reported, not raised


def test_watchdog_interval_from_environment() -> None:
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval_s({}) is None


def test_changed_keys() -> None:
    new = Config.model_validate({"interval_s": 3, "guards": {"cooldown_s": 1}})
    assert changed_keys(Config(), new) == ["interval_s", "guards.cooldown_s"]


class _Crashing:
    """A backend whose read crashes with a non-Slurm error: a bug inside a cycle."""

    def __init__(self) -> None:
        self.calls = 0

    def read_cluster(self, now: float | None = None):
        self.calls += 1
        raise RuntimeError(f"boom {self.calls}")


def _config(tmp_path: Path, **extra) -> Config:
    return Config.model_validate(
        {"state_dir": str(tmp_path / "state"), "interval_s": 0.05, "api": {"port": 0}, **extra}
    )


def _stop_after(predicate, timeout_s: float = 10.0) -> threading.Thread:
    """SIGTERM to this process once ``predicate()`` holds (the loop runs in the main thread)."""

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not predicate():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_crashing_cycle_keeps_the_loop_alive(tmp_path: Path, notify_socket) -> None:
    sock, path = notify_socket
    backend = _Crashing()
    service = Service(_config(tmp_path), backend=backend, notifier=Notifier(path), serve_api=False)
    _stop_after(lambda: backend.calls >= 3)
    assert service.run() == 0
    messages = _drain(sock, until=lambda m: _count(m, "STOPPING=1"), timeout_s=5)
    assert backend.calls >= 3
    # READY once (after the first finished cycle), a WATCHDOG per cycle, STOPPING last.
    assert messages[0].splitlines()[0] == "READY=1"
    assert _count(messages, "READY=1") == 1
    assert _count(messages, "WATCHDOG=1") == backend.calls
    assert "STATUS=cycle 1 failed: RuntimeError: boom 1" in messages[0]
    assert messages[-1].startswith("STOPPING=1")
    healthy, why = service.health(time.time())
    assert not healthy and "boom" in why
    document = read_document(tmp_path / "state" / STATUS_FILE)
    assert document["cycle"]["ok"] is False and "boom" in document["cycle"]["error"]
    assert service.metrics.cycles.labels(outcome="error")._value.get() == backend.calls


@pytest.mark.parametrize(("private", "mode"), [((), 0o644), (("jobs", "usage"), 0o600)])
def test_status_json_is_readable_by_all_only_when_slurm_hides_nothing(
    tmp_path: Path, private: tuple[str, ...], mode: int
) -> None:
    """Issue 38, class 2: with PrivateData=jobs the file would show every user every job;
    then only root reads it (users read /v1/status, which shows each what Slurm would)."""
    backend = RecordingBackend(snapshot([]), private_data=private, fresh=True)
    service = Service(_config(tmp_path), backend=backend, serve_api=False)
    assert service.run(once=True) == 0
    assert service.privacy().words == frozenset(private)
    path = tmp_path / "state" / STATUS_FILE
    assert path.stat().st_mode & 0o777 == mode


def test_a_requested_cycle_runs_without_waiting_for_the_interval(tmp_path: Path) -> None:
    """An accepted ack calls ``request_cycle`` (from the API thread): with a 60 s interval the
    second cycle must still follow within seconds, so a checkpointed job is shrunk at once."""
    backend = _Crashing()
    service = Service(
        _config(tmp_path, interval_s=60), backend=backend, notifier=Notifier(None), serve_api=False
    )

    def ask_once_the_first_cycle_ran() -> None:
        deadline = time.monotonic() + 10
        while backend.calls < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        service.request_cycle()

    threading.Thread(target=ask_once_the_first_cycle_ran, daemon=True).start()
    _stop_after(lambda: backend.calls >= 2, timeout_s=10)
    started = time.monotonic()
    assert service.run() == 0
    assert backend.calls >= 2
    assert time.monotonic() - started < 9


def test_unreachable_slurm_fails_cycles_but_not_the_daemon(tmp_path: Path, notify_socket) -> None:
    """The real CLI backend against a Slurm that is not there (a config file that is not)."""
    from slurm_elastic.slurm.cli import CliBackend

    sock, path = notify_socket
    backend = CliBackend(slurm_conf=str(tmp_path / "no-slurm.conf"), timeout_s=5)
    service = Service(_config(tmp_path), backend=backend, notifier=Notifier(path))
    # The daemon itself survives; only a one-cycle run reports the failure in its status.
    assert service.run(once=True) == ExitCode.CYCLE_FAILED
    messages = _drain(sock, until=lambda m: _count(m, "STOPPING=1"), timeout_s=5)
    assert messages[0].startswith("READY=1\nSTATUS=cycle 1 failed: observe:")
    assert "WATCHDOG=1" in messages[0].splitlines()
    document = service.status_document
    assert document is not None and document["cycle"]["ok"] is False
    assert not service.health(time.time())[0]


def test_sighup_reload_good_then_bad(tmp_path: Path, notify_socket) -> None:
    sock, path = notify_socket
    config_file = tmp_path / "main.yaml"
    state = tmp_path / "state"
    config_file.write_text(f"state_dir: {state}\ninterval_s: 0.05\napi: {{port: 0}}\n")
    backend = _Crashing()
    service = Service(
        load_config(config_file),
        lambda: load_config(config_file),
        backend=backend,
        notifier=Notifier(path),
        serve_api=False,
    )
    steps: list[str] = []

    def drive() -> None:
        while backend.calls < 2:
            time.sleep(0.01)
        config_file.write_text(
            f"state_dir: {state}\ninterval_s: 0.04\napi: {{port: 0}}\nguards: {{cooldown_s: 7}}\n"
        )
        os.kill(os.getpid(), signal.SIGHUP)
        while service.config.guards.cooldown_s != 7:
            time.sleep(0.01)
        steps.append("good reloaded")
        config_file.write_text("mode: nonsense\n")
        calls = backend.calls
        os.kill(os.getpid(), signal.SIGHUP)
        while backend.calls < calls + 3:  # the loop goes on with the old config
            time.sleep(0.01)
        steps.append("bad kept")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=drive, daemon=True).start()
    assert service.run() == 0
    assert steps == ["good reloaded", "bad kept"]
    assert service.config.guards.cooldown_s == 7 and service.config.mode == "shadow"
    assert service.controller.config is service.config  # the controller got the new one
    messages = _drain(sock, until=lambda m: _count(m, "STOPPING=1"), timeout_s=5)
    failed = [m for m in messages if "config reload failed" in m]
    assert failed and "main.yaml: mode: Input should be 'shadow' or 'enforce'" in failed[0]


def test_reload_keeps_keys_that_need_a_restart(tmp_path: Path) -> None:
    config_file = tmp_path / "main.yaml"
    config_file.write_text(f"state_dir: {tmp_path / 'a'}\napi: {{port: 0}}\n")
    service = Service(
        load_config(config_file),
        lambda: load_config(config_file),
        backend=_Crashing(),
        serve_api=False,
    )
    config_file.write_text(f"state_dir: {tmp_path / 'b'}\napi: {{port: 0}}\ninterval_s: 4\n")
    assert service.reload()
    assert service.config.state_dir == tmp_path / "a" and service.config.interval_s == 4


# --------------------------------------------------------------------------- live cluster


@pytest.mark.slurm
def test_daemon_process_under_a_systemd_like_supervisor(
    slurm_cluster, tmp_path: Path, notify_socket
) -> None:
    sock, path = notify_socket
    state = tmp_path / "state"
    config_file = write_config(tmp_path / "slurm-elastic.yaml", state)
    log_path = tmp_path / "daemon.log"
    with daemon_process(
        config_file, log_path, NOTIFY_SOCKET=path, WATCHDOG_USEC="10000000"
    ) as proc:
        first = _drain(sock, until=lambda m: _count(m, "WATCHDOG=1") >= 3, timeout_s=30)
        assert first, log_path.read_text()
        assert first[0].splitlines()[0] == "READY=1"
        assert "STATUS=cycle 1 ok" in first[0]
        assert _count(first, "READY=1") == 1 and _count(first, "WATCHDOG=1") >= 3

        url = wait_event(log_path, "api.listening")["url"]
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as response:
            assert response.status == 200
        with urllib.request.urlopen(f"{url}/v1/status", timeout=5) as response:
            served = json.loads(response.read())
        assert served["cycle"]["ok"] is True and served["daemon"]["mode"] == "shadow"
        assert read_document(state / STATUS_FILE)["cycle"]["count"] >= 1
        # 3 CLI processes, or 5 RPCs (6 on 24.11) where auto picks pyslurm (pyslurm_backend)
        assert wait_event(log_path, "cycle.done")["slurm_calls"] in (3, 5, 6)

        write_config(config_file, state, interval_s=0.4)
        proc.send_signal(signal.SIGHUP)
        assert wait_event(log_path, "config.reloaded")["changed"] == ["interval_s"]

        config_file.write_text("guards: {cooldwn_s: 1}\n")
        proc.send_signal(signal.SIGHUP)
        failed = wait_event(log_path, "config.reload_failed")
        assert "guards.cooldwn_s: unknown key" in failed["error"]
        more = _drain(sock, until=lambda m: _count(m, "WATCHDOG=1") >= 2, timeout_s=10)
        assert _count(more, "WATCHDOG=1") >= 2  # still cycling on the old config

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        rest = _drain(sock, until=lambda m: _count(m, "STOPPING=1"), timeout_s=5)
        assert _count(rest, "STOPPING=1") == 1


def test_logs_are_json_lines_off_a_tty() -> None:
    import io

    import structlog

    from slurm_elastic.logs import EVENTS, configure_logging

    out = io.StringIO()  # not a TTY, like journald or a pipe
    configure_logging("info", "auto", stream=out)
    try:
        structlog.get_logger("t").info("cycle.done", duration_s=0.1)
        structlog.get_logger("t").debug("below.level")
        try:
            raise ValueError("bad")
        except ValueError:
            structlog.get_logger("t").exception("cycle.failed")
    finally:
        configure_logging("info", "auto")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # one line per event, the traceback inside it
    done, failed = (json.loads(line) for line in lines)
    assert done["event"] == "cycle.done" and done["level"] == "info" and "timestamp" in done
    assert failed["event"] == "cycle.failed" and "ValueError: bad" in failed["exception"]
    assert {"cycle.done", "cycle.failed", "resize.applied", "report.rejected"} <= set(EVENTS)


def test_status_document_is_strict_json_even_with_infinite_estimates(tmp_path: Path) -> None:
    from slurm_elastic.daemon.status import (
        CycleContent,
        CycleInfo,
        DaemonInfo,
        build_document,
        write_atomic,
    )

    content = CycleContent(
        plan={"objective": float("inf"), "decisions": [{"predicted_gain": float("nan")}]}
    )
    document = build_document(
        5.0, DaemonInfo(1, 0.0, "shadow", "mip", 10.0), CycleInfo(1, True, 4.0, 5.0), content
    )
    assert document["plan"] == {"objective": None, "decisions": [{"predicted_gain": None}]}
    write_atomic(tmp_path / STATUS_FILE, document)
    text = (tmp_path / STATUS_FILE).read_text()
    assert "Infinity" not in text and "NaN" not in text
    assert read_document(tmp_path / STATUS_FILE)["cycle"]["duration_s"] == 1.0


def test_rows_carry_the_latest_progress_report() -> None:
    from slurm_elastic.daemon.service import with_progress
    from slurm_elastic.types import ProgressReport

    row = {"job_id": 7, "state": "RUNNING"}
    report = ProgressReport(job_id=7, time=100.0, step=1200, nodes=2, samples_per_s=850.5)
    assert with_progress(row, report, 61.25) == {
        "job_id": 7, "state": "RUNNING", "step": 1200, "samples_per_s": 850.5, "reported_at": 100.0,
        "saved_s": 61.2, "fallback": None,
    }  # fmt: skip
    assert with_progress(row, None)["step"] is None
    assert with_progress(row, None)["saved_s"] is None


def test_status_line_cannot_inject_assignments() -> None:
    from slurm_elastic.daemon.service import status_line

    line = status_line("cycle 3 failed: sbatch said\nREADY=1\nWATCHDOG=trigger")
    assert "\n" not in line and line.startswith("STATUS=cycle 3 failed: sbatch said READY=1")
    assert len(status_line("x" * 1000)) == len("STATUS=") + 400


def test_every_service_log_event_is_a_listed_stable_name() -> None:
    import ast

    import slurm_elastic.daemon as package
    from slurm_elastic.logs import EVENTS

    used: set[str] = set()
    for module in ("api", "auth", "service", "status", "metrics", "commands"):
        tree = ast.parse((Path(package.__file__).parent / f"{module}.py").read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "log"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                used.add(node.args[0].value)
    assert used, "no log calls found"
    assert used <= set(EVENTS), sorted(used - set(EVENTS))


def test_console_log_lines_show_hostile_text_escaped() -> None:
    """On a TTY the console renderer prints str values raw: a job name with escape sequences
    in a log value, or in an exception's message, must reach the terminal escaped."""
    import io

    import structlog

    from slurm_elastic.logs import configure_logging
    from tests.test_cli_commands import HOSTILE, RAW, _shown_safely

    out = io.StringIO()
    configure_logging("info", json_lines=False, stream=out)
    log = structlog.get_logger("test")
    log.info("report.rejected", name=HOSTILE, job_ids=[HOSTILE])
    try:
        raise ValueError(f"bad comment {HOSTILE}")
    except ValueError:
        log.exception("cycle.failed", error=HOSTILE)
    console = out.getvalue()
    _shown_safely(console)
    assert "Traceback (most recent call last):\n" in console  # still readable, line by line
    out = io.StringIO()
    configure_logging("info", json_lines=True, stream=out)
    log.info("report.rejected", name=HOSTILE)
    line = out.getvalue()
    assert not any(raw in line for raw in RAW)  # JSON's own escapes: \u001b, \u202e
    assert json.loads(line)["name"] == HOSTILE


def test_systemd_status_line_is_one_escaped_line() -> None:
    from slurm_elastic.daemon.service import status_line
    from tests.test_cli_commands import RAW

    line = status_line("cycle 3 failed: squeue: job \x1b]0;x\x07 \u202ename\nREADY=1")
    assert line.startswith("STATUS=cycle 3 failed: ") and "\n" not in line
    assert not any(raw in line for raw in RAW) and "\\x1b]0;x\\x07 \\u202ename READY=1" in line


def test_loans_and_reclaims_reach_the_status_document_and_the_metrics() -> None:
    from slurm_elastic.daemon.metrics import DaemonMetrics
    from slurm_elastic.daemon.reports import ReportStore
    from slurm_elastic.daemon.result import CycleResult, Reclaim
    from slurm_elastic.daemon.service import RECENT_RECLAIMS, content_of

    reclaim = Reclaim(8, 40, 1, planned_at=100.0, freed_at=104.5, detail="agent ready at step 9")
    result = CycleResult(
        now=104.5,
        ok=True,
        error=None,
        duration_s=0.1,
        slurm_calls=3,
        history_calls=0,
        snapshot_age_s=0.0,
        mode="enforce",
        reclaims=(reclaim,),
        nodes_on_loan=2,
    )
    earlier = [{"borrower": 5, "waiting_job": 6}] * (RECENT_RECLAIMS - 1)
    content = content_of(result, ReportStore(), [*earlier, reclaim.to_json()])
    assert content.extra["nodes_on_loan"] == 2
    assert content.extra["gpu_types"] == {}  # no snapshot kept with this result
    assert content.extra["reclaims"][-1] == {
        "borrower": 8, "waiting_job": 40, "nodes": 1, "planned_at": 100.0, "freed_at": 104.5,
        "seconds": 4.5, "detail": "agent ready at step 9",
    }  # fmt: skip
    metrics = DaemonMetrics()
    metrics.record_cycle(
        ok=True, duration_s=0.1, finished_at=104.5, nodes_on_loan=2, reclaim_seconds=[4.5]
    )
    text = metrics.exposition().decode()
    assert "slurm_elastic_nodes_on_loan 2.0" in text
    assert "slurm_elastic_reclaims_total 1.0" in text
    assert 'slurm_elastic_reclaim_seconds_bucket{le="5.0"} 1.0' in text


class _HangsOnRead(RecordingBackend):
    """Good cycles, then a read that never returns (a wedged Slurm call, a deadlock) until
    ``release`` is set: the loop thread hangs while the API threads go on."""

    def __init__(self, good_cycles: int) -> None:
        super().__init__(ClusterSnapshot(0.0, (), (), ()), fresh=True)
        self.good_cycles = good_cycles
        self.reads = 0
        self.hanging = threading.Event()
        self.release = threading.Event()

    def read_cluster(self, now: float | None = None) -> ClusterSnapshot:
        self.reads += 1
        if self.reads > self.good_cycles:
            self.hanging.set()
            self.release.wait(30)
        return super().read_cluster(now)


def test_a_hung_loop_stops_the_watchdog_pings_while_the_api_still_answers(
    tmp_path: Path, notify_socket
) -> None:
    """What the systemd test cannot show with SIGSTOP (which stops every thread): with only
    the loop thread stuck, no WATCHDOG=1 is sent (so systemd's watchdog fires) although the
    API threads still answer, and /healthz says 503 once the health window has passed.
    (The loop runs in the main thread, as in the daemon: it installs the signal handlers.)"""
    sock, path = notify_socket
    backend = _HangsOnRead(good_cycles=3)
    config = _config(tmp_path, slurm={"timeout_s": 0.5})
    service = Service(config, backend=backend, notifier=Notifier(path))
    seen: dict[str, Any] = {}

    def while_it_hangs() -> None:
        try:
            if not backend.hanging.wait(10):
                return
            seen["before"] = _drain(sock, until=lambda m: False, timeout_s=0.5)
            seen["silent"] = _drain(sock, until=lambda m: False, timeout_s=1.5)  # window 0.65 s
            assert service.api is not None
            seen["health"] = get_json(f"{service.api.url}/healthz", timeout_s=5)
            seen["status"] = get_json(f"{service.api.url}/v1/status", timeout_s=5)
        finally:
            backend.release.set()
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=while_it_hangs, daemon=True).start()
    assert service.run() == ExitCode.OK
    after = _drain(sock, until=lambda m: _count(m, "STOPPING=1"), timeout_s=5)
    assert _count(seen["before"], "READY=1") == 1 and _count(seen["before"], "WATCHDOG=1") == 3
    assert _count(seen["silent"], "WATCHDOG=1") == 0, seen["silent"]
    assert seen["health"].status == 503, seen["health"]
    assert seen["status"].status == 200 and seen["status"].body["cycle"]["count"] == 3
    assert _count(after, "STOPPING=1") == 1
