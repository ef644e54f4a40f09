"""Issue 20, item 1, on real Slurm: a resize Slurm refuses is recorded with Slurm's message
and kept as a fact about the job, never sent again every cycle.

The recorded case: from Slurm 23.11 the node count of a job with
``--distribution=arbitrary`` cannot be updated (SchedMD's changelog; 24.11 and 26.05 answer
"Requested operation not supported on this system"), and neither 24.11's squeue nor its
scontrol shows the distribution, so the daemon learns it from the refusal.  Slurm 22.05
shrinks such a job: there the mechanism does not exist, and the test says so.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from slurm_elastic.daemon.drill import ResizeDrill
from slurm_elastic.errors import AgentError
from slurm_elastic.marker import format_marker
from slurm_elastic.slurm.cli import CliBackend
from slurm_elastic.types import ActionKind, ElasticSpec
from tests.slurm_cluster import SlurmCluster, configured, wait_until

pytestmark = [pytest.mark.slurm]


def test_a_shrink_slurm_refuses_is_recorded_and_never_sent_again(
    clean_queue: SlurmCluster, tmp_path: Path
) -> None:
    if clean_queue.version == "22.05":
        pytest.skip("Slurm 22.05 shrinks a job with --distribution=arbitrary (23.11 refuses)")
    hosts = tmp_path / "hosts"
    hosts.write_text("n1\nn2\n")
    out = subprocess.run(
        ["sbatch", "--parsable", "-n2", "--distribution=arbitrary", "-o", "/dev/null",
         f"--chdir={tmp_path}", "--wrap", "sleep 300"],
        env={**clean_queue.env, "SLURM_HOSTFILE": str(hosts)},
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    job_id = int(out.strip().split(";")[0])

    def running() -> bool:
        view = CliBackend().read_job(job_id)
        return view is not None and view.state.value == "RUNNING" and len(view.nodes) == 2

    wait_until(running, 30, "the arbitrary-distribution job running on 2 nodes")
    # The submit plugin holds a marker to the job's --nodes, which the hostfile sets to
    # 2-2: the owner marks the running job instead (its own comment, as any user may).
    marker = format_marker(ElasticSpec(1, 2))
    clean_queue.run("scontrol", "update", f"JobId={job_id}", f"Comment={marker}")
    try:
        # No agent in this job: the daemon shrinks it without an ack (hard_shrink).
        with ResizeDrill(
            CliBackend(), tmp_path / "state", ack_timeout_s=1.0, hard_shrink=True
        ) as drill:
            result = drill.resize(job_id, 1, timeout_s=60)
            assert result.outcome == "refused", result
            assert "not supported" in result.detail, result.detail
            time.sleep(3.0)  # six more cycles with the same target
            last = drill.last
            shrinks = [e for e in drill.journal.actions_for(job_id) if e.kind is ActionKind.SHRINK]
        assert [str(e.status) for e in shrinks] == ["refused"], shrinks
        assert last is not None
        row = {r.job_id: r for r in last.jobs}[job_id]
        assert row.nodes == 2
        # Kept as a fact for guards.refusal_hold_s (an hour), or until the job changes.
        barred = f"blocked: shrink refused by Slurm: {result.detail} (barred "
        assert row.reason.startswith(barred), row.reason
        assert row.reason.endswith("s more, or until the job changes)"), row.reason
        view = CliBackend().read_job(job_id)
        assert view is not None and len(view.nodes) == 2  # Slurm kept it as it was
    finally:
        clean_queue.run("scancel", str(job_id), check=False)


STEPMGR = ["SlurmctldParameters=enable_stepmgr", "PrologFlags=contain"]  # 24.05+ needs both


def test_a_job_under_the_step_manager_is_never_shrunk(
    clean_queue: SlurmCluster, tmp_path: Path
) -> None:
    """Slurm accepts the shrink of a job whose steps its step manager runs, and leaves the
    steps running on the removed nodes (up to 26.05): the daemon reads the job's
    ``STEPMGR_ENABLED`` flag and never sends that shrink; its REASON says why."""
    if clean_queue.version == "22.05":
        pytest.skip("Slurm 22.05 has no step manager")
    with configured(clean_queue, STEPMGR):
        marker = format_marker(ElasticSpec(1, 3))
        out = clean_queue.run(
            "sbatch", "--parsable", "--nodes=1-3", f"--comment={marker}", "-o", "/dev/null",
            f"--chdir={tmp_path}", "--wrap", "sleep 300",
        ).stdout  # fmt: skip
        job_id = int(out.strip().split(";")[0])
        wait_until(lambda: _size(job_id) == ("RUNNING", 3), 30, "the job on 3 nodes")
        view = CliBackend().read_job(job_id)
        assert view is not None and view.stepmgr
        with ResizeDrill(
            CliBackend(), tmp_path / "state", ack_timeout_s=1.0, hard_shrink=True
        ) as drill:
            with pytest.raises(AgentError, match="did not resize"):
                drill.resize(job_id, 1, timeout_s=4)
            last = drill.last
            rows = drill.journal.actions_for(job_id)
        assert rows == ()  # not even tried
        assert last is not None
        reason = {r.job_id: r.reason for r in last.jobs}[job_id]
        assert reason.startswith("blocked: shrink barred: the job's steps run under"), reason
        assert _size(job_id) == ("RUNNING", 3)


def _size(job_id: int) -> tuple[str, int]:
    view = CliBackend().read_job(job_id)
    return ("GONE", 0) if view is None else (view.state.value, len(view.nodes))
