"""Hostile input in what the daemon reads from Slurm, against the real local cluster with
two unprivileged users (issue 19, classes 1 and 3).

se-bob submits held jobs whose comments and names hold bytes that are not UTF-8, newlines,
a ``|``, and whole forged rows in the old ``squeue -O``/``sacct -P`` format claiming a job
of se-alice; se-alice submits an honest elastic job.  The daemon's cycle must stay ok and
keep managing se-alice's job, leave se-bob's jobs alone with a reason, and the accounting
history must hold no forged row.  Runs on every version of the matrix (``make test``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_elastic.actuate.instructions import InstructionBoard
from slurm_elastic.actuate.journal import Journal
from slurm_elastic.config import Config
from slurm_elastic.daemon.controller import Controller
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.slurm.cli import CliBackend
from slurm_elastic.types import JobHistory, JobState
from tests.slurm_cluster import ClusterUser, SlurmCluster
from tests.test_slurm_backend_live import Factory
from tests.test_slurm_backend_live import new_backend as backend_fixture

pytestmark = pytest.mark.slurm
new_backend = backend_fixture  # the backends of the live backend suite: cli, and pyslurm

# Bytes that are not UTF-8 reach sbatch's argv through Python's surrogateescape.
BAD_BYTES = "\udcfe\udcff"
# The job id the forged rows claim: one no real job of a test cluster reaches (the clusters'
# counters persist across runs; a whole CI run submits a few thousand jobs, and 4242, the
# captured fixtures' id, was reached once), below Slurm's default MaxJobId (67043328).
FORGED_ID = 66_004_242


def forged_comment(now: str = "2026-01-01T00:00:00") -> str:
    """A comment whose next lines are whole rows in the old '|'-separated formats, for a
    running 4-node elastic job (squeue -O) and a finished job (sacct -P) of se-alice."""
    squeue_row = (
        f"{FORGED_ID}|N/A|N/A|RUNNING|4|4|n[1-4]|n1|UNLIMITED|{now}|{now}|N/A|0|None|"
        "se-alice|1001|default|batch|normal|cpu=16,node=4|N/A|(null)|/home/se-alice|fake|"
        "elastic:min=1,max=4"
    )
    sacct_row = (
        f"{FORGED_ID}|{FORGED_ID}|COMPLETED|4|n[1-4]|{now}|{now}|{now}|se-alice|default|"
        "batch|/home/se-alice|train|elastic"
    )
    return f"forged\n{squeue_row}\n{sacct_row}"


@pytest.fixture
def hostile(
    clean_queue: SlurmCluster, two_users: tuple[ClusterUser, ClusterUser]
) -> Iterator[dict[str, int]]:
    """se-bob's hostile jobs (held: they stay in the queue) and se-alice's honest elastic
    job (not held: the daemon plans only for jobs Slurm may start)."""
    alice, bob = two_users
    jobs = {
        "badbytes": bob.sbatch(
            "--hold", "-N1", f"-Jbad{BAD_BYTES}name", f"--comment=elastic{BAD_BYTES}",
            "--wrap", "sleep 60",
        ),
        "newline": bob.sbatch(
            "--hold", "-N1-2", "-Jna\nme|x", "--comment=elastic:min=1,max=2\nX",
            "--wrap", "sleep 60",
        ),
        "forged": bob.sbatch(
            "--hold", "-N1", f"--comment={forged_comment()}", "--wrap", "sleep 60",
        ),
        "honest": alice.sbatch("--nodes=1-3", "--comment=elastic", "--wrap", "sleep 60"),
    }  # fmt: skip
    yield jobs
    clean_queue.run("scancel", *map(str, jobs.values()), check=False)


def shadow_controller(backend: CliBackend, state_dir: Path) -> Controller:
    config = Config.model_validate(
        {
            "mode": "shadow",
            "state_dir": str(state_dir),
            "slurm": {"sacct_interval_s": 3600, "sacct_lookback_s": 3600},
        }
    )
    return Controller(
        backend,
        config,
        reports=ReportStore(),
        journal=Journal.in_state_dir(state_dir),
        agents=InstructionBoard(),
    )


def test_hostile_comments_never_stop_the_cycle(
    hostile: dict[str, int], new_backend: Factory, clean_queue: SlurmCluster, tmp_path: Path
) -> None:
    backend = new_backend(slurm_conf=str(clean_queue.conf), timeout_s=20)
    ctl = shadow_controller(backend, tmp_path)
    for _ in range(2):  # the second cycle runs on what the first one learnt
        result = ctl.run_once(time.time())
        assert result.ok, result.error
        rows = {row.job_id: row for row in result.jobs}
        assert FORGED_ID not in rows
        honest = rows[hostile["honest"]]
        assert (honest.user, honest.min_nodes, honest.max_nodes) == ("se-alice", 1, 3)
        assert honest.target is not None  # planned: still managed
        for name in ("badbytes", "newline", "forged"):
            row = rows[hostile[name]]
            assert row.user == "se-bob" and row.target is None, name
            assert row.reason.startswith("comment not trusted, job left alone: "), row.reason
        assert "not UTF-8" in rows[hostile["badbytes"]].reason
        assert "U+000A" in rows[hostile["newline"]].reason
    views = {v.job_id: v for v in backend.read_jobs()}
    assert views[hostile["badbytes"]].comment == "elastic\ufffd\ufffd"
    assert views[hostile["newline"]].name == "na\nme|x"
    assert views[hostile["forged"]].comment == forged_comment()


def test_every_job_read_agrees_on_hostile_jobs(
    hostile: dict[str, int], clean_queue: SlurmCluster
) -> None:
    """squeue --json, the squeue -O text path and read_job (scontrol --json from 24.11 on,
    squeue -j -O on 22.05) see the same jobs with the same fields, and no forged one."""
    conf = str(clean_queue.conf)
    by_json = {v.job_id: v for v in CliBackend(slurm_conf=conf).read_jobs()}
    by_text = {v.job_id: v for v in CliBackend(slurm_conf=conf, job_format="text").read_jobs()}
    assert FORGED_ID not in by_json and FORGED_ID not in by_text
    one = CliBackend(slurm_conf=conf)
    for job_id in hostile.values():
        single = one.read_job(job_id)
        assert single is not None
        want = by_json[job_id]
        for view in (by_text[job_id], single):  # (se-alice's job may start in between)
            assert (view.user, view.name, view.comment, view.work_dir) == (
                want.user,
                want.name,
                want.comment,
                want.work_dir,
            )


def wait_finished(backend: CliBackend, since: float, ids: set[int]) -> tuple[JobHistory, ...]:
    """The history once every job of ``ids`` is COMPLETED in it (bounded poll)."""
    deadline = time.monotonic() + 60
    while True:
        history = backend.read_history(since)
        done = {h.job_id for h in history if h.state is JobState.COMPLETED}
        if ids <= done or time.monotonic() > deadline:
            return history
        time.sleep(0.5)


@pytest.mark.parametrize("history_format", ["text", "json"])
def test_history_holds_no_forged_row(
    clean_queue: SlurmCluster, two_users: tuple[ClusterUser, ClusterUser], history_format: str
) -> None:
    """se-bob's finished job whose comment holds a whole sacct -P row of se-alice: the
    history has his job, as his, with that comment, and no job 4242."""
    alice, bob = two_users
    since = time.time() - 5
    forged = bob.sbatch("-p", "shared", "-N1", "-Jforgedone", f"--comment={forged_comment()}",
                        "--wrap", "true")  # fmt: skip
    honest = alice.sbatch("-p", "shared", "-N1", "-Jalicedone", "--comment=elastic",
                          "--wrap", "true")  # fmt: skip
    backend = CliBackend(slurm_conf=str(clean_queue.conf), history_format=history_format)
    history = {h.job_id: h for h in wait_finished(backend, since, {forged, honest})}
    assert FORGED_ID not in history
    assert history[forged].state is JobState.COMPLETED
    assert (history[forged].user, history[forged].name) == ("se-bob", "forgedone")
    assert history[forged].comment == forged_comment()
    assert (history[honest].user, history[honest].name) == ("se-alice", "alicedone")
    assert {h.user for h in history.values() if h.job_id in {forged, honest}} == {
        "se-alice",
        "se-bob",
    }
