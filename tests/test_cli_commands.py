"""``status``, ``plan``, ``explain`` and ``config check``: pure rendering, then the real CLI on
the live cluster (subprocesses, stdout not a TTY: the plain-text form scripts read).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from slurm_elastic.config import Config
from slurm_elastic.daemon.commands import (
    STATUS_COLUMNS,
    _action_rows,
    config_check,
    daemon,
    explain,
    explain_job,
    explain_lines,
    filter_jobs,
    plan,
    status,
    status_problem,
)
from slurm_elastic.daemon.exitcodes import ExitCode
from slurm_elastic.daemon.status import STATUS_FILE, read_document, write_atomic
from slurm_elastic.slurm.cli import CliBackend
from slurm_elastic.terminal import safe_text
from tests.slurm_cluster import wait_until
from tests.test_daemon_service_process import MAIN as _MAIN
from tests.test_daemon_service_process import daemon_process, wait_api, write_config

ROWS = [
    {"job_id": 7, "user": "alice", "state": "RUNNING", "min": 1, "max": 4, "target": 2},
    {"job_id": 8, "user": "bob", "state": "PENDING", "min": None, "max": None, "target": None},
]


# One status row of an elastic job, as the controller publishes it.
TRAIN_ROW = {
    "job_id": 7,
    "partition": "batch",
    "name": "train",
    "user": "alice",
    "state": "RUNNING",
    "nodes": 2,
    "min": 1,
    "max": 4,
    "target": 3,
    "reason": "target 3",
    "step": 1200,
    "samples_per_s": 850.5,
    "saved_s": 3725.4,
}


def test_filter_jobs() -> None:
    assert [j["job_id"] for j in filter_jobs(ROWS, ["alice"], [])] == [7]
    assert [j["job_id"] for j in filter_jobs(ROWS, [], [8])] == [8]
    assert filter_jobs(ROWS, ["carol"], []) == []
    assert filter_jobs(ROWS, [], []) == ROWS


def test_status_problem() -> None:
    config = Config()
    fresh = {"generated_at": 1000.0, "daemon": {"interval_s": 10}, "cycle": {"ok": True}}
    assert status_problem(fresh, config, 1010.0) is None
    stale = status_problem(fresh, config, 1000.0 + 3 * 10 + 20 + 1)
    assert stale is not None and stale.exit_code == ExitCode.STALE
    assert "51s old" in stale.warning
    failed = {**fresh, "cycle": {"ok": False, "error": "observe: slurmctld down"}}
    problem = status_problem(failed, config, 1001.0)
    assert problem is not None and problem.exit_code == ExitCode.CYCLE_FAILED
    assert "slurmctld down" in problem.warning
    # A stale document's failure is old news: the daemon not cycling is what matters now.
    old_failure = status_problem(failed, config, 1000.0 + 3 * 10 + 20 + 1)
    assert old_failure is not None and old_failure.exit_code == ExitCode.STALE


def test_explain_from_a_document() -> None:
    measured = [{"nodes": 1, "steps_per_s": 0.5}, {"nodes": 2, "steps_per_s": 0.93}]
    document = {
        "jobs": [{**TRAIN_ROW, "measured": measured}],
        "plan": {
            "solver": "mip",
            "status": "optimal",
            "objective": 12.5,
            "solve_s": 0.02,
            "note": "",
            "decisions": [
                {
                    "job_id": 7,
                    "current_nodes": 2,
                    "target_nodes": 3,
                    "rule": "marginal-gain",
                    "predicted_gain": 420.0,
                    "resize_cost": 30.0,
                    "detail": "best use of n4",
                    "candidates": [
                        {"nodes": n, "steps_per_s": r, "predicted_gain": g, "resize_cost": c}
                        for n, r, g, c in [
                            (1, 0.5, -1600.0, 18.0),
                            (2, 0.9, 0.0, 0.0),
                            (3, 1.3, 420.0, 30.0),
                            (4, 1.6, 390.0, 45.0),
                        ]
                    ],
                }
            ],
        },
        "actions": [
            {
                "job_id": 7,
                "kind": "grow",
                "from_nodes": 2,
                "to_nodes": 3,
                "outcome": "shadow",
                "detail": "shadow mode: not applied",
            }
        ],
    }
    found = explain_job(document, 7)
    assert found is not None and explain_job(document, 99) is None
    text = "\n".join(explain_lines(found))
    assert "job 7 (train, user alice, batch): RUNNING at 2 node(s), elastic 1-4" in text
    assert "target: 2 -> 3 node(s)" in text
    assert "rule: marginal-gain (best use of n4)" in text
    assert "predicted gain: 420 steps" in text and "resize cost: 30 steps" in text
    assert "action: grow 2->3: shadow" in text
    assert "plan: solver mip, optimal" in text
    # Every size weighed: measured and predicted rate, gain and cost (issue 23, item 5).
    table = text.split("sizes weighed")[1].splitlines()[1:6]
    assert table[0].split() == ["NODES", "MEASURED/S", "PREDICTED/S", "GAIN", "COST"]
    assert table[1].split() == ["1", "0.5", "0.5", "-1600", "18"]
    assert table[2].split() == ["2", "0.93", "0.9", "+0", "0", "now"]
    assert table[3].split() == ["3", "-", "1.3", "+420", "30", "chosen"]
    assert table[4].split() == ["4", "-", "1.6", "+390", "45"]
    # Nulls (the status document's unknown or unbounded numbers) read as "-", never crash.
    decision = document["plan"]["decisions"][0]
    decision["candidates"][3] = {"nodes": 4, "steps_per_s": None, "predicted_gain": None}
    found = explain_job({**document, "jobs": [{**TRAIN_ROW, "measured": [{"nodes": 4}]}]}, 7)
    assert found is not None
    last = "\n".join(explain_lines(found)).split("sizes weighed")[1].splitlines()[5]
    assert last.split() == ["4", "-", "-", "-", "-"]


def test_status_plain_table_and_filters(tmp_path: Path) -> None:
    document = {
        "version": 1,
        "generated_at": time.time(),
        "daemon": {"mode": "shadow", "policy": "mip", "interval_s": 10},
        "cycle": {"count": 4, "ok": True},
        "plan": None,
        "actions": [],
        "nodes_on_loan": 1,
        "reclaims": [
            {"borrower": 7, "waiting_job": 9, "nodes": 1, "seconds": 12.5, "detail": "agent ready"}
        ],
        "gpu_types": {"t4": "t4", "batch": "", "a100": "a100"},
        "jobs": [
            {**TRAIN_ROW, "loan": 1},
            {
                "job_id": 8,
                "partition": "shared",
                "name": "plain",
                "user": "bob",
                "state": "PENDING",
                "nodes": 1,
                "min": None,
                "max": None,
                "target": None,
                "reason": "not elastic",
            },
        ],
    }
    path = tmp_path / STATUS_FILE
    write_atomic(path, document)
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"state_dir: {tmp_path}\n")
    runner = CliRunner()
    result = runner.invoke(status, ["--config", str(config_file), "--file", str(path)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == list(STATUS_COLUMNS)
    assert (
        " ".join(lines[1].split()) == "7 batch train alice R 2 1 4 3 1 1200 850.5 +1h02m target 3"
    )
    assert " ".join(lines[2].split()) == "8 shared plain bob PD 1 - - - - - - - not elastic"
    assert "# 1 nodes on loan; last reclaim: job 7 gave back 1 to job 9 in 12.5s" in result.output
    assert "# GPU types: a100 a100, t4 t4" in result.output  # untyped partitions left out
    result = runner.invoke(
        status, ["--config", str(config_file), "--file", str(path), "-u", "bob", "--json"]
    )
    assert [j["job_id"] for j in json.loads(result.stdout)["jobs"]] == [8]
    result = runner.invoke(status, ["--config", str(config_file), "--file", str(path), "-j", "x"])
    assert result.exit_code == 2 and "not a job id" in result.output


def test_status_without_any_daemon_is_one_line_error(tmp_path: Path) -> None:
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"state_dir: {tmp_path}\napi: {{port: 1}}\n")
    result = CliRunner().invoke(status, ["--config", str(config_file)])
    assert result.exit_code == 1
    assert result.output.startswith("Error: no daemon status: ")
    assert len(result.output.strip().splitlines()) == 1


def _status_in_state_dir(tmp_path: Path, *, ok: bool, age_s: float) -> Path:
    """A config whose state_dir holds a status.json of this outcome and age; no daemon API
    answers (port 1), so ``status`` and ``explain`` both read that file."""
    write_atomic(
        tmp_path / STATUS_FILE,
        {
            "version": 1,
            "generated_at": time.time() - age_s,
            "daemon": {"mode": "shadow", "policy": "mip", "interval_s": 10},
            "cycle": {"count": 4, "ok": ok, "error": None if ok else "observe: slurmctld down"},
            "plan": None,
            "actions": [],
            "jobs": [TRAIN_ROW],
        },
    )
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"state_dir: {tmp_path}\napi: {{port: 1}}\n")
    return config_file


# (cycle ok, age of the document in s, exit status, warning); stale = older than 3*10+20 s.
STATUS_CASES = [
    (True, 0.0, ExitCode.OK, None),
    (False, 0.0, ExitCode.CYCLE_FAILED, "warning: the last cycle failed: observe: slurmctld down"),
    (True, 3600.0, ExitCode.STALE, "is the daemon running?"),
    (False, 3600.0, ExitCode.STALE, "is the daemon running?"),
]


@pytest.mark.parametrize(("ok", "age_s", "code", "warning"), STATUS_CASES)
def test_status_exit_status_follows_the_daemons_cycle(
    tmp_path: Path, ok: bool, age_s: float, code: ExitCode, warning: str | None
) -> None:
    config_file = _status_in_state_dir(tmp_path, ok=ok, age_s=age_s)
    runner = CliRunner()
    table = runner.invoke(status, ["--config", str(config_file)])
    assert table.exit_code == code, table.output
    assert table.stdout.splitlines()[1].split()[:2] == ["7", "batch"]  # rows all the same
    as_json = runner.invoke(status, ["--config", str(config_file), "--json"])
    assert as_json.exit_code == code, as_json.output
    assert [j["job_id"] for j in json.loads(as_json.stdout)["jobs"]] == [7]
    for result in (table, as_json):
        if warning is None:
            assert "warning" not in result.stderr
        else:
            assert warning in result.stderr


@pytest.mark.parametrize(("ok", "age_s", "code", "warning"), STATUS_CASES)
def test_explain_exit_status_follows_the_daemons_cycle(
    tmp_path: Path, ok: bool, age_s: float, code: ExitCode, warning: str | None
) -> None:
    config_file = _status_in_state_dir(tmp_path, ok=ok, age_s=age_s)
    runner = CliRunner()
    text = runner.invoke(explain, ["7", "--config", str(config_file)])
    assert text.exit_code == code, text.output
    assert text.stdout.startswith("job 7 (train, user alice, batch): RUNNING")
    as_json = runner.invoke(explain, ["7", "--config", str(config_file), "--json"])
    assert as_json.exit_code == code, as_json.output
    assert json.loads(as_json.stdout)["job"]["job_id"] == 7
    assert (warning is None) == ("warning" not in text.stderr)
    # A job the daemon does not know stays a plain error, whatever the cycle did.
    assert runner.invoke(explain, ["99", "--config", str(config_file)]).exit_code == 1


def test_a_failed_cycle_exits_3_without_slurm_commands(tmp_path: Path) -> None:
    """No Slurm client on PATH: a real failed cycle (``SlurmUnreachable``), no cluster needed.

    ``daemon --once`` still publishes the failure for ``status``; ``plan --json`` still prints
    the result on stdout, so that a script can read why.
    """
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"state_dir: {tmp_path / 'state'}\napi: {{port: 0}}\n")
    no_slurm = {"PATH": str(tmp_path / "empty")}
    runner = CliRunner()
    once = runner.invoke(daemon, ["--config", str(config_file), "--once"], env=no_slurm)
    assert once.exit_code == ExitCode.CYCLE_FAILED, once.output
    published = read_document(tmp_path / "state" / STATUS_FILE)["cycle"]
    assert published["ok"] is False and "'squeue' not found" in published["error"]

    as_json = runner.invoke(plan, ["--config", str(config_file), "--json"], env=no_slurm)
    assert as_json.exit_code == ExitCode.CYCLE_FAILED, as_json.output
    wire = json.loads(as_json.stdout)
    assert wire["ok"] is False and "'squeue' not found" in wire["error"]
    assert "Error: dry-run cycle failed: observe: " in as_json.stderr

    table = runner.invoke(plan, ["--config", str(config_file)], env=no_slurm)
    assert table.exit_code == ExitCode.CYCLE_FAILED and table.stdout == ""
    assert "Error: dry-run cycle failed: observe: " in table.stderr

    why = runner.invoke(explain, ["7", "--dry-run", "--config", str(config_file)], env=no_slurm)
    assert why.exit_code == ExitCode.CYCLE_FAILED, why.output
    assert "Error: dry-run cycle failed: observe: " in why.stderr  # not "job 7 is not in..."


def test_config_check_lists_every_key_with_its_source(tmp_path: Path) -> None:
    main = tmp_path / "slurm-elastic.yaml"
    main.write_text("mode: enforce\n")
    (tmp_path / "conf.d").mkdir()
    extra = tmp_path / "conf.d" / "10-guards.yaml"
    extra.write_text("guards: {cooldown_s: 30}\n")
    result = CliRunner().invoke(config_check, ["--config", str(main)])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if "=" in line}
    assert len(lines) == len(Config().provenance)
    assert lines["mode"].endswith(f"# {main}") and '"enforce"' in lines["mode"]
    assert lines["guards.cooldown_s"].endswith(f"# {extra}")
    assert lines["guards.min_dwell_s"].endswith("# default")
    result = CliRunner().invoke(config_check, ["--config", str(main), "--json"])
    payload = json.loads(result.stdout)
    assert payload["sources"]["guards.cooldown_s"] == str(extra)
    assert payload["values"]["guards"]["cooldown_s"] == 30


def test_config_check_bad_config_is_one_line(tmp_path: Path) -> None:
    main = tmp_path / "slurm-elastic.yaml"
    main.write_text("api: {port: http}\n")
    result = CliRunner().invoke(config_check, ["--config", str(main)])
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"Error: {main}: api.port: Input should be a valid integer, unable to parse string "
        "as an integer (got 'http')"
    )


# --------------------------------------------------------------------------- live cluster


def _cli(
    *args: str, check: bool = True, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-c", _MAIN, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _sbatch(*args: str) -> int:
    out = subprocess.run(
        ["sbatch", "--parsable", "-t", "5", "-o", "/dev/null", *args, "--wrap", "sleep 300"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return int(out.strip().split(";")[0])


@pytest.fixture
def live_jobs(clean_queue, tmp_path: Path) -> Iterator[tuple[Path, int, int]]:
    config_file = tmp_path / "slurm-elastic.yaml"
    config_file.write_text(f"state_dir: {tmp_path / 'state'}\napi: {{port: 0}}\n")
    elastic = _sbatch("-N1-2", "--comment=elastic", "-J", "cli-elastic", "-p", "shared")
    plain = _sbatch("-N1", "-J", "cli-plain", "-p", "shared")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait until Slurm has placed both
            states = subprocess.run(
                ["squeue", "-h", "-j", f"{elastic},{plain}", "-o", "%T"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout.split()
            if states and all(s == "RUNNING" for s in states):
                break
            time.sleep(0.3)
        _cli("daemon", "--once", "--config", str(config_file))
        yield config_file, elastic, plain
    finally:
        subprocess.run(["scancel", str(elastic), str(plain)], timeout=30, check=False)


@pytest.mark.slurm
def test_status_on_the_live_cluster(live_jobs) -> None:
    config_file, elastic, plain = live_jobs
    proc = _cli("status", "--config", str(config_file))
    lines = proc.stdout.splitlines()
    assert lines[0].split() == list(STATUS_COLUMNS)
    rows = {int(line.split()[0]): line.split() for line in lines[1:]}
    assert rows[elastic][1:5] == ["shared", "cli-elastic", "root", "R"]
    assert rows[elastic][6] != "-" and rows[elastic][7] != "-"  # MIN / MAX of an elastic job
    assert rows[plain][1:5] == ["shared", "cli-plain", "root", "R"]
    # MIN MAX TARGET LOAN STEP RATE SAVED
    assert rows[plain][6:13] == ["-"] * 7 and " ".join(rows[plain][13:]) == "not elastic"
    assert "cycle 1 ok" in proc.stderr  # the footer goes to stderr when piped

    only = _cli("status", "--config", str(config_file), "-j", str(plain), "--json")
    assert [j["job_id"] for j in json.loads(only.stdout)["jobs"]] == [plain]
    mine = _cli("status", "--config", str(config_file), "--me", "--json")
    assert {elastic, plain} <= {j["job_id"] for j in json.loads(mine.stdout)["jobs"]}
    nobody = _cli("status", "--config", str(config_file), "-u", "nobody")
    assert nobody.stdout.splitlines() == [" ".join(STATUS_COLUMNS)]


@pytest.mark.slurm
def test_status_warns_when_stale(live_jobs) -> None:
    config_file, _, _ = live_jobs
    path = Path(read_config_state_dir(config_file)) / STATUS_FILE
    document = read_document(path)
    write_atomic(path, {**document, "generated_at": time.time() - 3600})
    proc = _cli("status", "--config", str(config_file), check=False)
    assert proc.returncode == ExitCode.STALE, proc.stderr
    assert proc.stdout.splitlines()[0].split() == list(STATUS_COLUMNS)
    assert re.search(r"warning: status is 3[56]\d\ds old .* is the daemon running\?", proc.stderr)


def read_config_state_dir(config_file: Path) -> str:
    from slurm_elastic.config import load_config

    return str(load_config(config_file).state_dir)


@pytest.mark.slurm
def test_plan_and_explain_on_the_live_cluster(live_jobs) -> None:
    config_file, elastic, plain = live_jobs
    proc = _cli("plan", "--config", str(config_file))
    assert proc.stdout.startswith("plan: solver ")
    header = proc.stdout.splitlines()[1].split()
    assert header == ["JOBID", "NOW", "TARGET", "CHANGE", "RULE", "GAIN", "COST", "DETAIL"]
    planned = {int(line.split()[0]) for line in proc.stdout.splitlines()[2:] if line[:1].isdigit()}
    assert elastic in planned and plain not in planned

    wire = json.loads(_cli("plan", "--config", str(config_file), "--json").stdout)
    assert wire["ok"] is True and wire["mode"] == "shadow"
    # 3 CLI processes, or 5 RPCs (6 on 24.11) where auto picks pyslurm (slurm.pyslurm_backend)
    assert wire["slurm_calls"] in (3, 5, 6)
    assert all(a["outcome"] != "applied" for a in wire["actions"])  # a dry run acts on nothing

    why = _cli("explain", str(elastic), "--config", str(config_file))
    assert f"job {elastic} (cli-elastic, user root, shared): RUNNING" in why.stdout
    assert "rule: " in why.stdout and "predicted gain: " in why.stdout
    assert "resize cost: " in why.stdout

    rigid = _cli("explain", str(plain), "--config", str(config_file))
    assert "no decision: the daemon does not resize this job" in rigid.stdout

    fresh = _cli("explain", str(elastic), "--config", str(config_file), "--dry-run", "--json")
    assert json.loads(fresh.stdout)["decision"]["job_id"] == elastic

    missing = _cli("explain", "999999", "--config", str(config_file), check=False)
    assert missing.returncode == 1
    assert missing.stderr.strip().startswith("Error: job 999999 is not in the daemon's view")


def _controller_down_conf(conf: Path, tmp_path: Path) -> Path:
    """A copy of the live cluster's slurm.conf whose slurmctld port nobody listens on.

    Slurm's clients then exit 0 with an ``errors`` entry and no jobs (tests/fixtures/slurm/
    22.05/CAPTURED.md, ``squeue-controller-down.json``): the quiet failure that must not pass
    for an empty cluster.  MessageTimeout=2 makes each such call take ~1 s instead of ~9 s.
    """
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    text = re.sub(r"(?m)^SlurmctldPort=.*$", f"SlurmctldPort={port}", conf.read_text())
    assert f"SlurmctldPort={port}" in text
    path = tmp_path / "slurm.conf"
    path.write_text(text + "MessageTimeout=2\n")
    return path


@pytest.mark.slurm
def test_exit_status_against_a_dead_and_the_live_controller(slurm_cluster, tmp_path: Path) -> None:
    config_file = tmp_path / "slurm-elastic.yaml"
    config_file.write_text(f"state_dir: {tmp_path / 'state'}\napi: {{port: 0}}\n")
    args = ("--config", str(config_file))
    down = {**os.environ, "SLURM_CONF": str(_controller_down_conf(slurm_cluster.conf, tmp_path))}

    once = _cli("daemon", "--once", *args, env=down, check=False)
    assert once.returncode == ExitCode.CYCLE_FAILED, once.stderr
    failed = _cli("status", *args, check=False)
    assert failed.returncode == ExitCode.CYCLE_FAILED, failed.stderr
    # The first read names the backend auto picked: squeue (CLI) or slurm_load_jobs (pyslurm).
    first_read = r"observe: (squeue --json|pyslurm slurm_load_jobs): "
    assert re.search(r"warning: the last cycle failed: " + first_read, failed.stderr)
    planned = _cli("plan", "--json", *args, env=down, check=False)
    assert planned.returncode == ExitCode.CYCLE_FAILED, planned.stderr
    wire = json.loads(planned.stdout)
    assert wire["ok"] is False
    assert re.match(first_read, wire["error"])

    # The same commands against the live controller: 0, and status recovers with the cycle.
    assert _cli("daemon", "--once", *args, check=False).returncode == ExitCode.OK
    recovered = _cli("status", "--json", *args, check=False)
    assert recovered.returncode == ExitCode.OK, recovered.stderr
    assert json.loads(recovered.stdout)["cycle"]["ok"] is True
    planned = _cli("plan", "--json", *args, check=False)
    assert planned.returncode == ExitCode.OK, planned.stderr
    assert json.loads(planned.stdout)["ok"] is True


@pytest.mark.slurm
def test_plan_json_lists_the_elastic_jobs_of_this_version(clean_queue, tmp_path: Path) -> None:
    """Issue 13's check, on every version of the matrix: two ``--nodes=1-3 --comment=elastic``
    jobs and one rigid job; ``plan --json`` lists both elastic jobs with their range, state and
    size, leaves the rigid one alone, and exits 0."""
    config_file = tmp_path / "slurm-elastic.yaml"
    config_file.write_text(f"state_dir: {tmp_path / 'state'}\napi: {{port: 0}}\n")
    submit = ("sbatch", "--parsable", "-o", "/dev/null", "--chdir", str(tmp_path))
    elastic = [
        int(clean_queue.run(*submit, "--nodes=1-3", "--comment=elastic", "--wrap", "sleep 300")
            .stdout.strip().split(";")[0])
        for _ in range(2)
    ]  # fmt: skip
    rigid = int(clean_queue.run(*submit, "-N2", "--wrap", "sleep 300").stdout.split(";")[0])

    def placed() -> bool:  # the first elastic job runs, and every job has been looked at
        states = dict(line.split("|") for line in clean_queue.run(
            "squeue", "-h", "-o", "%i|%T").stdout.split())  # fmt: skip
        return states.get(str(elastic[0])) == "RUNNING" and len(states) == 3

    wait_until(placed, 30, "the first elastic job running")
    # Slurm may start the second elastic job while plan runs: its row must match what the
    # CLI read just before or just after, never something else.
    before = {v.job_id: v for v in CliBackend().read_jobs()}
    planned = _cli("plan", "--json", "--config", str(config_file), check=False)
    assert planned.returncode == ExitCode.OK, planned.stderr
    wire = json.loads(planned.stdout)
    assert wire["ok"] is True
    rows = {row["job_id"]: row for row in wire["jobs"]}
    assert set(rows) >= set(elastic)
    assert rigid not in rows or rows[rigid]["target"] is None  # listed, never planned
    after = {v.job_id: v for v in CliBackend().read_jobs()}
    for job_id in elastic:
        row = rows[job_id]
        assert (row["min"], row["max"]) == (1, 3), row
        # A pending job's row gives its requested minimum (JobView.node_count), as status does.
        seen = {(views[job_id].state.value, views[job_id].node_count) for views in (before, after)}
        assert (row["state"], row["nodes"]) in seen, (row, seen)
        assert 1 <= row["target"] <= 3
    assert rows[elastic[0]]["state"] == "RUNNING" and 1 <= rows[elastic[0]]["nodes"] <= 3


@pytest.mark.slurm
def test_status_through_the_running_daemons_api(slurm_cluster, tmp_path: Path) -> None:
    config_file = write_config(tmp_path / "slurm-elastic.yaml", tmp_path / "state")
    log_path = tmp_path / "daemon.log"
    with daemon_process(config_file, log_path) as daemon:
        url = wait_api(log_path, tmp_path / "state" / STATUS_FILE)
        proc = _cli("status", "--config", str(config_file), "--api", url, "--json")
        document = json.loads(proc.stdout)
        assert document["source"] == f"{url}/v1/status"
        assert document["cycle"]["ok"] is True and document["daemon"]["pid"] == daemon.pid


def test_daemon_start_errors_are_one_line(tmp_path: Path) -> None:
    from slurm_elastic.daemon.commands import daemon

    bad = tmp_path / "bad.yaml"
    bad.write_text("interval_s: 0\n")
    result = CliRunner().invoke(daemon, ["--config", str(bad), "--once"])
    assert result.exit_code == 1
    assert (
        result.output.strip()
        == f"Error: {bad}: interval_s: Input should be greater than or equal to 0.01 (got 0)"
    )

    blocker = tmp_path / "file"
    blocker.write_text("")
    unwritable = tmp_path / "c.yaml"
    unwritable.write_text(f"state_dir: {blocker}/state\n")
    result = CliRunner().invoke(daemon, ["--config", str(unwritable), "--once"])
    assert result.exit_code == ExitCode.STATE
    assert result.output.strip() == (
        f"Error: {blocker}/state: cannot create the state directory (state_dir): Not a directory"
    )

    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = tmp_path / "busy.yaml"
        busy.write_text(f"state_dir: {tmp_path / 's'}\napi: {{port: {port}}}\n")
        result = CliRunner().invoke(daemon, ["--config", str(busy), "--once"])
    assert result.exit_code == 1
    assert result.output.strip().endswith(
        f"Error: api.port: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


def _on_a_tty(*args: str, code: int = 0) -> str:
    """What ``slurm-elastic ARGS`` writes to a terminal (a pty: rich styles its tables)."""
    import pty

    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(COLUMNS="200", TERM="xterm")  # CI may run with TERM=dumb
    proc = subprocess.Popen(
        [sys.executable, "-c", _MAIN, *args], stdout=secondary, stderr=secondary, env=env
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    assert proc.wait(timeout=30) == code
    return b"".join(chunks).decode("utf-8")


def test_status_uses_rich_only_on_a_tty(tmp_path: Path) -> None:
    path = tmp_path / STATUS_FILE
    write_atomic(
        path,
        {"version": 1, "generated_at": time.time(), "daemon": {}, "cycle": {"ok": True},
         "jobs": [TRAIN_ROW]},
    )  # fmt: skip
    on_tty = _on_a_tty("status", "--file", str(path), "--config", "/dev/null")
    assert "\x1b[" in on_tty and "JOBID" in on_tty and "alice" in on_tty  # styled by rich
    piped = _cli("status", "--file", str(path), "--config", "/dev/null")
    assert "\x1b[" not in piped.stdout and piped.stdout.splitlines()[0].split()[0] == "JOBID"


# --------------------------------------------------------------------------- hostile text

# What a user can put in a job name, comment or user field, and what each one does raw:
# OSC 0 retitles the terminal, CSI recolours and moves the cursor, C1 CSI (0x9b) is CSI in
# one byte, CR overwrites the line, U+202E reverses what follows, U+2066 isolates, U+200B
# hides, U+2028 breaks the line, a lone surrogate (an undecodable byte) cannot be printed,
# rich markup makes an OSC 8 link.
HOSTILE = (
    "x\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x9b1m\r\u202egnp.exe\u2066\u200b\u2028"
    "\udcfe[link=http://evil.invalid]click[/link]"
)
RAW = ("\x1b]", "\x1b[2J", "\x1b[31m", "\x9b", "\r", "\u202e", "\u2066", "\u200b", "\u2028")


def _shown_safely(out: str) -> None:
    for raw in RAW:
        assert raw not in out, repr(raw)
    assert "\\x1b]0;pwned\\x07" in out and "\\u202egnp.exe" in out  # shown, escaped


def test_safe_text_escapes_what_a_terminal_would_act_on() -> None:
    assert safe_text(HOSTILE) == (
        "x\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mred\\x9b1m\\x0d\\u202egnp.exe\\u2066\\u200b"
        "\\u2028\\udcfe[link=http://evil.invalid]click[/link]"
    )
    assert safe_text("tab\there\nand") == "tab\\x09here\\x0aand"
    assert safe_text("trace\nback\x1b", multiline=True) == "trace\nback\\x1b"
    for fine in ("café 日本語 🚀 naïve", "a b", "", "path/to\\file"):
        assert safe_text(fine) == fine  # printable text is left as it is
    assert safe_text(42) == "42"


@given(st.text())
def test_safe_text_output_is_always_printable(text: str) -> None:
    shown = safe_text(text)
    assert shown.isprintable()
    assert (shown == text) == text.isprintable()


def _hostile_status(tmp_path: Path) -> Path:
    row = {**TRAIN_ROW, "name": HOSTILE, "user": HOSTILE, "reason": f"malformed: {HOSTILE}"}
    path = tmp_path / STATUS_FILE
    write_atomic(
        path,
        {"version": 1, "generated_at": time.time(), "daemon": {"interval_s": 10},
         "cycle": {"ok": False, "error": f"observe: {HOSTILE}"}, "jobs": [row],
         "plan": {"solver": "mip", "status": "optimal", "objective": 1.0, "solve_s": 0.1,
                  "note": HOSTILE, "decisions": [
                      {"job_id": 7, "current_nodes": 2, "target_nodes": 3, "rule": HOSTILE,
                       "predicted_gain": 1.0, "resize_cost": 0.5, "detail": HOSTILE}]},
         "actions": [{"job_id": 7, "kind": "grow", "from_nodes": 2, "to_nodes": 3,
                      "outcome": "shadow", "detail": HOSTILE}]},
    )  # fmt: skip
    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"state_dir: {tmp_path}\napi: {{port: 1}}\n")
    return config_file


def test_status_and_explain_show_hostile_text_escaped_in_pipes(tmp_path: Path) -> None:
    config_file = _hostile_status(tmp_path)
    status_out = CliRunner().invoke(status, ["--config", str(config_file)])
    assert status_out.exit_code == ExitCode.CYCLE_FAILED
    _shown_safely(status_out.output)  # the rows and the "last cycle failed" warning
    explained = CliRunner().invoke(explain, ["--config", str(config_file), "7"])
    assert explained.exit_code == ExitCode.CYCLE_FAILED
    _shown_safely(explained.output)
    assert "\\x1b]0;pwned" in explained.output.split("action: grow")[1]  # the action's detail


def test_status_on_a_tty_shows_hostile_text_escaped(tmp_path: Path) -> None:
    """rich passes escape sequences in a str through and reads markup in it: neither here."""
    config_file = _hostile_status(tmp_path)
    on_tty = _on_a_tty("status", "--config", str(config_file), code=ExitCode.CYCLE_FAILED)
    _shown_safely(on_tty.replace("\r\n", "\n"))  # the pty's own line ends
    assert "\x1b]8;" not in on_tty and "[link=http://evil.invalid]click[/link]" in on_tty


def test_json_output_keeps_hostile_text_exact_and_escaped(tmp_path: Path) -> None:
    config_file = _hostile_status(tmp_path)
    result = CliRunner().invoke(status, ["--config", str(config_file), "--json"])
    document = json.loads(result.stdout)
    assert document["jobs"][0]["name"] == HOSTILE  # a machine gets the text as it is
    for raw in RAW:
        assert raw not in result.stdout  # JSON's own escapes (\u001b, \u202e)


def test_plan_tables_and_error_lines_show_hostile_text_escaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from slurm_elastic.daemon.commands import _ACTION_COLUMNS, CycleFailed, render_table

    action = {"job_id": 7, "kind": "grow", "from_nodes": 1, "to_nodes": 2, "outcome": "failed"}
    render_table(_ACTION_COLUMNS, _action_rows([{**action, "detail": HOSTILE}], ()), title="t")
    _shown_safely(capsys.readouterr().out)
    error = CycleFailed(f"dry-run cycle failed: {HOSTILE}")
    _shown_safely(error.format_message())


@pytest.mark.slurm
def test_a_users_hostile_job_name_reaches_the_admin_escaped(
    clean_queue, two_users, tmp_path: Path
) -> None:
    """se-alice names her elastic job with escape sequences and a bidi override: Slurm keeps
    them (squeue prints them raw); status, explain and plan show them escaped, JSON exact."""
    alice, _ = two_users
    name = "x\x1b]0;pwned\x07\x1b[2J\u202egnp"
    job_id = alice.sbatch(
        "-N1-2", "--comment=elastic", "-J", name, "--wrap", "sleep 300", cwd=alice.home
    )
    config_file = tmp_path / "slurm-elastic.yaml"
    config_file.write_text(f"state_dir: {tmp_path / 'state'}\napi: {{port: 0}}\n")
    args = ("--config", str(config_file))
    _cli("daemon", "--once", *args)
    shown = "".join(
        _cli(*command, *args).stdout
        for command in (("status",), ("explain", str(job_id), "--dry-run"), ("plan",))
    )
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in shown
    assert f"{job_id} " in shown and "x\\x1b]0;pwned\\x07\\x1b[2J\\u202egnp" in shown
    document = json.loads(_cli("status", "--json", *args).stdout)
    assert {j["job_id"]: j["name"] for j in document["jobs"]}[job_id] == name


@pytest.mark.parametrize(
    "command",
    [["daemon", "--once"], ["plan"], ["status"], ["explain", "7"], ["config", "check"]],
)
@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"mode: shadow\n# caf\xe9\n", "(file): not UTF-8 text (byte 0xe9 at offset 18)"),
        (b"mode: [shadow\n", "line 2: invalid YAML: "),
        (b"interval_s: .inf\n", "interval_s: Input should be a finite number (got inf)"),
    ],
)
def test_every_command_refuses_a_bad_config_in_one_line(
    tmp_path: Path, command: list[str], content: bytes, reason: str
) -> None:
    from slurm_elastic.cli import cli

    bad = tmp_path / "slurm-elastic.yaml"
    bad.write_bytes(content)
    result = CliRunner().invoke(cli, [*command, "--config", str(bad)])
    assert result.exit_code == 1
    (line,) = result.output.splitlines()
    assert line.startswith(f"Error: {bad}: {reason}")
