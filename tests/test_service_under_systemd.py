"""The shipped unit under a real systemd (issue 16, item 4).

``tests/test_daemon_service_systemd.py`` checks the unit's text; this test runs it.  It boots
a container with systemd as PID 1 from this machine's own file system (an overlay of ``/``,
``scripts/systemd-container.sh``) and, inside it, installs the package and the unit the way
docs/admin-guide.md tells an admin to (``pip install .``, the config, the unchanged unit
file, ``systemctl daemon-reload``), against the live local cluster (the container shares
the host's network, so the daemon reaches slurmctld on loopback; munged's socket is bound
in).  Then, in one run of about 30 s:

* ``systemctl start`` returns only once the first cycle has finished (``Type=notify``,
  ``READY=1`` from the loop): the first ``cycle.done`` precedes ``ActiveEnterTimestamp``;
* ``systemctl reload`` re-reads the config: shadow -> enforce and interval 3 s -> 1 s show
  in the daemon's log, its status document and in what it does next;
* which is growing se-alice's running elastic job with a companion job that Slurm records
  as se-alice's: ``runuser`` + ``sbatch`` + munge work under the unit's hardening (whose
  capability set and no-new-privileges the test reads from the running daemon);
* a hung loop (SIGSTOP of the main process) is killed by the watchdog and restarted (a
  stopped process pings from no thread at all: that only the loop pings is
  slurm_elastic.daemon.service's design, not tested here);
* ``systemctl restart`` with ``slurm.backend: cli``: Slurm's CLI under the hardening too
  (``auto`` picks pyslurm where ``make setup`` built it);
* ``systemctl stop`` is clean: the daemon logs its stop, systemd logs success, nothing is
  killed and the unit is inactive, not failed.

The unit is version-free: only its Slurm side (``sbatch`` as the owner) touches Slurm, and
that is what the live daemon and hostile-user tests run on every version.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.slurm_cluster import ClusterUser, SlurmCluster, in_ci

REPO = Path(__file__).resolve().parent.parent
CONTAINER_SH = REPO / "scripts" / "systemd-container.sh"
UNIT = REPO / "systemd" / "slurm-elastic.service"
SERVICE = "slurm-elastic.service"
# The unit's ExecStart: where `pip install .` as root puts the command on Debian.
SHIPPED_EXEC = "/usr/local/bin/slurm-elastic"
SHARE = "/run/slurm-elastic-test"  # where the test's files appear inside the container
COMPANION = "slurm-elastic:companion-of="
WATCHDOG_S = 8  # the drop-in's WatchdogSec (the unit ships 120 s)
FIRST_INTERVAL_S = 3  # before the reload; twice this stays under WATCHDOG_S
# Prints where the installed distribution put its console script.
WHERE_IS_THE_COMMAND = """
import importlib.metadata, os
dist = importlib.metadata.distribution("slurm-elastic")
files = [f for f in dist.files or () if f.name == "slurm-elastic"]
print(*[os.path.realpath(dist.locate_file(f)) for f in files])
"""
# Daemon warnings that say nothing about the unit: the journal of the daemon that the
# watchdog killed; and a job id that sacct shows for two jobs (a test cluster restarted
# with fresh state restarts its job counter while its accounting database keeps the jobs
# of earlier runs: the daemon says so and keeps the newest, slurm_elastic.slurm.history).
EXPECTED_WARNINGS = {"journal.recovered", "history.job_id_reused"}
# systemd's "Deactivated successfully" (unit_log_success), sd-messages.h SD_MESSAGE_UNIT_SUCCESS.
UNIT_SUCCESS = "7ad2d189f7e94e70a38c781354912448"
# Capability numbers (linux/capability.h) of the names the unit may put in its bounding set.
CAPABILITIES = {
    "CAP_CHOWN": 0,
    "CAP_DAC_OVERRIDE": 1,
    "CAP_DAC_READ_SEARCH": 2,
    "CAP_FOWNER": 3,
    "CAP_KILL": 5,
    "CAP_SETGID": 6,
    "CAP_SETUID": 7,
    "CAP_NET_BIND_SERVICE": 10,
    "CAP_SYS_RESOURCE": 24,
    "CAP_AUDIT_WRITE": 29,
}


def unavailable(reason: str) -> None:
    """Skip here, fail under CI: there every tool this test needs is installed."""
    if in_ci():
        pytest.fail(f"CI is set but the systemd container cannot run: {reason}")
    pytest.skip(reason)


def shipped_caps() -> int:
    """The unit's CapabilityBoundingSet as the kernel's bit mask."""
    (line,) = [
        line for line in UNIT.read_text().splitlines() if line.startswith("CapabilityBoundingSet=")
    ]
    names = line.partition("=")[2].split()
    unknown = [n for n in names if n not in CAPABILITIES]
    assert not unknown, f"add {unknown} to CAPABILITIES (linux/capability.h)"
    return sum(1 << CAPABILITIES[n] for n in names)


def munge_socket_dir(conf: Path) -> str:
    """The directory of the munged socket the cluster's clients use (AuthInfo's socket=)."""
    for line in conf.read_text().splitlines():
        if line.strip().startswith("AuthInfo="):
            match = re.search(r"socket=([^,\s]+)", line)
            if match:
                return str(Path(match[1]).parent)
    return "/run/munge"  # munge's compiled-in default


def parse_timestamp(text: str) -> float:
    """``systemctl show --timestamp=us+utc`` ("Fri 2026-11-27 02:38:32.943412 UTC")."""
    moment = datetime.strptime(text.strip(), "%a %Y-%m-%d %H:%M:%S.%f UTC")
    return moment.replace(tzinfo=UTC).timestamp()


def log_time(event: dict[str, Any]) -> float:
    """The daemon's own timestamp of a log event (structlog's ISO 8601, UTC)."""
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


@dataclass
class Guest:
    """The booted container: commands run inside it as root (nsenter)."""

    directory: Path

    def run(
        self, *args: str, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        cmd = ["bash", str(CONTAINER_SH), "exec", "--dir", str(self.directory), "--", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"in the container: {' '.join(args)} exited {proc.returncode}\n"
                f"{proc.stdout}{proc.stderr}\n--- journal of {SERVICE}:\n{self.journal_tail()}"
            )
        return proc

    def sh(self, script: str, timeout: float = 60.0) -> str:
        return self.run("sh", "-ec", script, timeout=timeout).stdout

    def show(self, *props: str) -> dict[str, str]:
        """``systemctl show`` of the service (timestamps with microseconds, UTC)."""
        args = ["systemctl", "show", "--timestamp=us+utc", SERVICE]
        out = self.run(*args, *(f"--property={p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def entries(self) -> list[dict[str, Any]]:
        """The service's journal: the daemon's lines and systemd's about the unit."""
        out = self.run("journalctl", "--unit", SERVICE, "--output=json", "--no-pager").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The daemon's structured log events (JSON lines on stdout), in order, each with
        the journal's ``_PID`` and ``_CAP_EFFECTIVE`` of the process that wrote it."""
        found = []
        for entry in self.entries():
            message = entry.get("MESSAGE")
            if entry.get("_TRANSPORT") != "stdout" or not isinstance(message, str):
                continue
            try:
                event = json.loads(message)
            except ValueError:
                continue
            if isinstance(event, dict) and (name is None or event.get("event") == name):
                event["_PID"] = entry.get("_PID")
                event["_CAP_EFFECTIVE"] = entry.get("_CAP_EFFECTIVE")
                found.append(event)
        return found

    def systemd_says(self, since_us: int = 0) -> list[dict[str, Any]]:
        """systemd's own journal lines about the unit, from ``since_us`` (realtime µs)."""
        return [
            e
            for e in self.entries()
            if e.get("SYSLOG_IDENTIFIER") == "systemd"
            and int(e.get("__REALTIME_TIMESTAMP", 0)) >= since_us
        ]

    def status_document(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.sh("cat /var/lib/slurm-elastic/status.json"))
        return doc

    def journal_tail(self, lines: int = 40) -> str:
        cmd = ["bash", str(CONTAINER_SH), "exec", "--dir", str(self.directory), "--"]
        cmd += ["journalctl", "--unit", SERVICE, "--no-pager", "-o", "cat", "-n", str(lines)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        return proc.stdout + proc.stderr


def wait_for(what: Callable[[], Any], timeout_s: float, why: str, guest: Guest) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f}s: {why}\n{guest.journal_tail()}")


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A directory the container's files come from, readable by se-alice: the companion
    runs the stand-in agent from here (on the host's slurmd, as se-alice)."""
    path = Path(tempfile.mkdtemp(prefix="slurm-elastic-systemd-"))
    path.chmod(0o755)
    yield path
    # Never walk into the container's overlay of `/` should `down` have failed to unmount it.
    mounted = [m for m in (path / "container").glob("*") if os.path.ismount(m)]
    if mounted:
        warnings.warn(f"left {path} in place: still mounted: {mounted}", stacklevel=1)
        return
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def guest(slurm_cluster: SlurmCluster, workdir: Path) -> Iterator[Guest]:
    """The container, booted; powered off and unmounted whatever the test did."""
    for tool in ("systemd-nspawn", "nsenter"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed (Debian package systemd-container): make setup")
    share = workdir / "share"
    share.mkdir()
    directory = workdir / "container"
    binds = ["--bind", munge_socket_dir(slurm_cluster.conf)]
    binds += ["--bind-ro", f"{share}:{SHARE}", "--bind-ro", str(REPO)]
    up = subprocess.run(
        ["bash", str(CONTAINER_SH), "up", "--dir", str(directory), *binds],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    try:
        if up.returncode != 0:
            pytest.fail(f"the container did not boot:\n{up.stdout}{up.stderr}")
        yield Guest(directory)
    finally:
        subprocess.run(
            ["bash", str(CONTAINER_SH), "down", "--dir", str(directory)],
            capture_output=True,
            timeout=120,
            check=False,
        )


def write_share(share: Path, cluster: SlurmCluster, exec_start: str | None) -> None:
    """What the admin brings: the config, /etc/default/slurm-elastic, the test's drop-in."""
    agent = share.parent / "fake-agent"
    agent.write_text(
        "#!/bin/sh\n# stand-in for `slurm-elastic run --join PARENT`\nexec sleep 600\n"
    )
    agent.chmod(0o755)
    slurm = {"sacct_interval_s": 3600, "sacct_lookback_s": 3600}
    config: dict[str, object] = {
        "mode": "shadow",
        "interval_s": FIRST_INTERVAL_S,
        "api": {"port": 0},  # the host's network: never take a port someone else uses
        "slurm": slurm,
        # Grow at once (docs/policies.md): no cooldown, no dwell, no payback horizon.
        "guards": {"cooldown_s": 0, "min_dwell_s": 0, "payback_horizon_s": 0},
        "grow": {"agent_command": str(agent)},
    }
    (share / "slurm-elastic.yaml").write_text(yaml.safe_dump(config))
    enforce = {**config, "mode": "enforce", "interval_s": 1}
    (share / "enforce.yaml").write_text(yaml.safe_dump(enforce))
    # slurm.backend needs a restart; the CLI backend runs squeue/scontrol/sacct under the unit.
    cli = {**enforce, "slurm": {**slurm, "backend": "cli"}}
    (share / "cli.yaml").write_text(yaml.safe_dump(cli))
    # The cluster's slurm.conf, as a site names a non-default one.
    (share / "default").write_text(f"SLURM_CONF={cluster.conf}\n")
    lines = [
        "# What this test changes in the shipped unit, and why:",
        "[Service]",
        "# A hung loop must trip the watchdog within seconds, not the shipped 120 s.",
        f"WatchdogSec={WATCHDOG_S}",
    ]
    if exec_start is not None:
        # Where pip put the command for this interpreter (pyenv, a venv): the admin guide's
        # "another install path".  On Debian's python3 it is the unit's own /usr/local/bin.
        lines += ["ExecStart=", f"ExecStart={exec_start} daemon"]
    (share / "override.conf").write_text("\n".join(lines) + "\n")


def elastic_job_at_one_node(alice: ClusterUser, cluster: SlurmCluster, workdir: Path) -> int:
    """se-alice's running ``-N1-3 --comment=elastic`` job at 1 node, 3 nodes idle beside it.

    Slurm would start a ``-N1-3`` job on 3 idle nodes, so it is held, pinned to 1 node and
    released (job_submit.lua has completed the marker to ``elastic:min=1,max=3``).  Its name
    and work dir are this run's own: the daemon's priors come from finished jobs of the same
    user with the same name or work dir (docs/models.md), and earlier runs' jobs, cancelled
    after seconds, would make this one look nearly done, which no grow pays back.
    """
    cwd = workdir / "alice"
    cwd.mkdir(mode=0o755)
    # Hers: the companion, run from the parent's work dir, writes its slurm-%j.out there.
    os.chown(cwd, alice.uid, pwd.getpwnam(alice.name).pw_gid)
    name = f"systemd-test-{workdir.name}"
    job = alice.sbatch(
        "-N1-3", "--hold", "--comment=elastic", f"--job-name={name}", "--wrap", "sleep 600", cwd=cwd
    )
    cluster.run("scontrol", "update", f"JobId={job}", "NumNodes=1-1")
    cluster.run("scontrol", "release", str(job))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = cluster.run("squeue", "-h", "-j", str(job), "-o", "%T|%D|%k").stdout.strip()
        if out == "RUNNING|1|elastic:min=1,max=3":
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job} is not running at 1 node: {out!r}")


def queue(cluster: SlurmCluster) -> list[tuple[int, str, str, str]]:
    """(job id, user, state, comment) of every job in the queue."""
    out = cluster.run("squeue", "-h", "-o", "%i|%u|%T|%k").stdout
    rows = [line.split("|", 3) for line in out.splitlines() if line]
    return [(int(r[0]), r[1], r[2], r[3]) for r in rows]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.default_slurm_only(
    "the unit and the daemon's systemd protocol are version-free; its one Slurm effect, a "
    "companion submitted as the owner, is what the live daemon and hostile-user tests run on "
    "every version"
)
def test_the_unit_under_systemd(
    guest: Guest,
    clean_queue: SlurmCluster,
    two_users: tuple[ClusterUser, ClusterUser],
    workdir: Path,
) -> None:
    cluster = clean_queue
    alice = two_users[0]
    parent = elastic_job_at_one_node(alice, cluster, workdir)

    # ---------------------------------------------------------------- install (the admin)
    # `pip install .` from a copy of the checkout (a build writes into its source tree), with
    # the interpreter that runs this test; no index, no build isolation: nothing is fetched.
    guest.sh(
        f"mkdir /tmp/src && tar -C {REPO} --exclude=__pycache__ -cf - pyproject.toml "
        "README.md slurm_elastic systemd etc | tar -C /tmp/src -xf - && cd /tmp/src && "
        f"PIP_BREAK_SYSTEM_PACKAGES=1 {sys.executable} -m pip install --quiet --no-deps "
        "--no-build-isolation --no-index --disable-pip-version-check --root-user-action=ignore .",
        timeout=180,
    )
    where = guest.run(sys.executable, "-c", WHERE_IS_THE_COMMAND).stdout.split()
    assert len(where) == 1, f"no slurm-elastic command among the installed files: {where}"
    exec_start = None if where[0] == SHIPPED_EXEC else where[0]
    share = workdir / "share"
    write_share(share, cluster, exec_start)
    # A fresh head node: the overlay shows this machine's /var/lib/slurm-elastic, whose
    # state (if any) is not this daemon's.
    guest.sh(
        "rm -f /var/lib/slurm-elastic/status.json /var/lib/slurm-elastic/journal.sqlite*; "
        "install -d /etc/slurm-elastic/conf.d; "
        f"install -m 644 {SHARE}/slurm-elastic.yaml /etc/slurm-elastic/slurm-elastic.yaml; "
        f"install -m 644 {SHARE}/default /etc/default/slurm-elastic; "
        f"set -a; . /etc/default/slurm-elastic; set +a; {where[0]} config check >/dev/null; "
        "install -m 644 /tmp/src/systemd/slurm-elastic.service /etc/systemd/system/; "
        "install -d /etc/systemd/system/slurm-elastic.service.d; "
        f"install -m 644 {SHARE}/override.conf /etc/systemd/system/slurm-elastic.service.d/; "
        "systemctl daemon-reload; systemctl enable --quiet slurm-elastic"
    )
    installed = guest.sh("cat /etc/systemd/system/slurm-elastic.service")
    assert installed == UNIT.read_text(), "the unit under test is the shipped file, unchanged"

    # ---------------------------------------------------------------- start: READY after cycle 1
    before = time.time()
    guest.run("systemctl", "start", SERVICE, timeout=200)
    start_s = time.time() - before
    props = guest.show("ActiveState", "ActiveEnterTimestamp", "ExecMainStartTimestamp", "MainPID")
    assert props["ActiveState"] == "active", props
    ready_at = parse_timestamp(props["ActiveEnterTimestamp"])
    exec_at = parse_timestamp(props["ExecMainStartTimestamp"])
    first = wait_for(lambda: guest.events("cycle.done"), 30, "a first cycle", guest)[0]
    assert first["ok"], first
    # systemd had the main process before it counted the service as started, and READY=1
    # came only with the first finished cycle (which started and finished in between).
    assert exec_at < log_time(first), (exec_at, first)
    assert log_time(first) <= ready_at, (
        f"the service was active at {ready_at:.6f}, before its first cycle finished "
        f"({first['timestamp']}): READY=1 must come after the first cycle"
    )
    doc = guest.status_document()
    assert doc["cycle"]["count"] >= 1 and doc["daemon"]["pid"] == int(props["MainPID"])
    assert exec_at < doc["cycle"]["started_at"] and doc["daemon"]["mode"] == "shadow"
    # Shadow: the real policy wants se-alice's job at 3 nodes and does nothing about it.
    wants = [a for a in doc["actions"] if a["job_id"] == parent and a["kind"] == "grow"]
    assert wants and wants[0]["outcome"] == "shadow", doc["actions"]
    assert [j for j in queue(cluster) if j[3].startswith(COMPANION)] == []

    # ---------------------------------------------------------------- reload: enforce, 1 s
    guest.sh(
        f"install -m 644 {SHARE}/enforce.yaml /etc/slurm-elastic/slurm-elastic.yaml; "
        "systemctl reload slurm-elastic"
    )
    reloaded = wait_for(
        lambda: guest.events("config.reloaded"), 15, "config.reloaded after reload", guest
    )
    assert sorted(reloaded[0]["changed"]) == ["interval_s", "mode"], reloaded
    assert reloaded[0]["needs_restart"] == [], reloaded
    wait_for(
        lambda: guest.status_document()["daemon"]["mode"] == "enforce",
        10,
        "the status document in enforce mode",
        guest,
    )
    assert guest.status_document()["daemon"]["interval_s"] == 1.0
    assert guest.show("MainPID")["MainPID"] == props["MainPID"], "reload must not restart"

    # ---------------------------------------------------------------- the companion, as se-alice
    companions = wait_for(
        lambda: [j for j in queue(cluster) if j[3] == f"{COMPANION}{parent}"],
        30,
        f"a companion of job {parent}",
        guest,
    )
    (companion,) = companions
    assert companion[1] == alice.name, f"the companion must be the owner's: {companion}"
    # And it runs (a companion Slurm cannot start as her, e.g. no writable work dir, fails).
    wait_for(
        lambda: (companion[0], alice.name, "RUNNING") in [j[:3] for j in queue(cluster)],
        30,
        f"companion {companion[0]} running",
        guest,
    )
    (submitted,) = [e for e in guest.events("slurm.submit") if e.get("job_id") == companion[0]]
    assert submitted["user"] == alice.name
    # Submitted under the hardening: the daemon's effective capabilities are exactly the
    # unit's bounding set, and no new privileges (what runuser, munge and sbatch must live with).
    assert int(submitted["_CAP_EFFECTIVE"], 16) == shipped_caps(), submitted
    pid = guest.show("MainPID")["MainPID"]
    proc_status = guest.sh(f"cat /proc/{pid}/status")
    assert re.search(r"^NoNewPrivs:\s+1$", proc_status, re.M), proc_status
    assert re.search(rf"^CapBnd:\s+0*{shipped_caps():x}$", proc_status, re.M), proc_status

    # Slurm's own record (accounting) says the same owner.
    def accounted_user() -> str:
        out = cluster.run("sacct", "-n", "-X", "-P", "-j", str(companion[0]), "-o", "User")
        return out.stdout.strip()

    acct = wait_for(accounted_user, 20, f"job {companion[0]} in accounting", guest)
    assert acct == alice.name, acct

    # ---------------------------------------------------------------- the watchdog
    hung_at_us = int(time.time() * 1e6)
    guest.run("kill", "-STOP", pid)

    def back_up() -> dict[str, str] | None:
        now = guest.show("NRestarts", "ActiveState", "SubState", "MainPID")
        running = (now["ActiveState"], now["SubState"]) == ("active", "running")
        new_pid = now["MainPID"] not in ("0", pid)
        return now if now["NRestarts"] == "1" and running and new_pid else None

    # WatchdogSec, then RestartSec=5 (the shipped unit's), then the new first cycle.
    restarted = wait_for(back_up, WATCHDOG_S + 40, "a watchdog restart", guest)
    said = [str(e.get("MESSAGE")) for e in guest.systemd_says(hung_at_us)]
    assert any("Watchdog timeout" in m for m in said), said
    assert any(f"Killing process {pid} " in m and "SIGABRT" in m for m in said), said
    # The new daemon cycles again (and keeps its companion: the journal reconciles).
    wait_for(
        lambda: (
            (d := guest.status_document())["daemon"]["pid"] == int(restarted["MainPID"])
            and d["cycle"]["ok"]
        ),
        20,
        "a good cycle of the restarted daemon",
        guest,
    )
    still = queue(cluster)
    assert any(j[0] == companion[0] for j in still), f"{still}\n{guest.journal_tail()}"

    # ---------------------------------------------------------------- restart, CLI backend
    # `auto` picked pyslurm where a build for this Slurm is installed (make setup builds
    # one): the Slurm CLI as the daemon's reader, subprocesses under the hardening, too.
    guest.sh(
        f"install -m 644 {SHARE}/cli.yaml /etc/slurm-elastic/slurm-elastic.yaml; "
        "systemctl restart slurm-elastic"
    )
    restarted = guest.show("MainPID", "ActiveState")
    assert restarted["ActiveState"] == "active", restarted
    (chosen,) = [
        e for e in guest.events("slurm.backend_selected") if e["_PID"] == restarted["MainPID"]
    ]
    assert chosen["backend"] == "cli", chosen
    cycles = [e for e in guest.events("cycle.done") if e["_PID"] == restarted["MainPID"]]
    assert cycles and cycles[0]["ok"], cycles  # READY=1 came after it, as above

    # ---------------------------------------------------------------- a clean stop
    stop_at_us = int(time.time() * 1e6)
    before = time.time()
    guest.run("systemctl", "stop", SERVICE, timeout=120)
    stop_s = time.time() - before
    assert guest.run("systemctl", "is-active", SERVICE, check=False).stdout.strip() == "inactive"
    assert guest.run("systemctl", "is-failed", SERVICE, check=False).stdout.strip() == "inactive"
    stopping = [e for e in guest.events("daemon.stopping") if e["_PID"] == restarted["MainPID"]]
    assert stopping, guest.journal_tail()
    said_after = guest.systemd_says(stop_at_us)
    messages = [str(e.get("MESSAGE")) for e in said_after]
    # Success (exit 0, or the clean SIGTERM), and no SIGKILL after TimeoutStopSec.
    assert any(e.get("MESSAGE_ID") == UNIT_SUCCESS for e in said_after), messages
    assert not any("Failed with result" in m or "Killing" in m for m in messages), messages
    assert stop_s < 30, f"systemctl stop took {stop_s:.1f}s"
    # Nothing went wrong on the way that the daemon noticed: the one warning expected is the
    # journal's recovery after the watchdog's SIGABRT.
    troubles = [
        e
        for e in guest.events()
        if e.get("level") in ("warning", "error", "critical")
        and e.get("event") not in EXPECTED_WARNINGS
    ]
    assert troubles == [], troubles
    print(f"start {start_s:.2f}s (first cycle included), stop {stop_s:.2f}s")
