"""Issue 38, class 5, live: another user's kill requests against a torchft-mode job.

se-bob, an unprivileged user on the same machine, scans the batch host for the job's
lighthouse (its port is drawn at random and written only where the job's owner reads it)
and sends 50 kill requests through its dashboard, round robin over the job's replica groups.
On 108c305 7-9 such requests used up the job's relaunches and it ended FAILED.  Now the
groups they end do not spend its relaunch budget; after ``OUTSIDE_KILL_LIMIT`` of them the
launcher falls back to the restart mode, which has no kill request to answer, and the job
trains on to COMPLETED with every sample exactly once per epoch.  (The job itself runs as
root: torch is installed in root's home here, which no other user may read.  Only the
attacker needs to be someone else, and he is.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchft")

from slurm_elastic.agent.launcher import OUTSIDE_KILL_LIMIT  # noqa: E402
from slurm_elastic.agent.rendezvous import PORT_BASE, PORT_SPAN  # noqa: E402
from slurm_elastic.daemon.commands import FALLBACK_TEXT, _status_row  # noqa: E402
from slurm_elastic.daemon.drill import ResizeDrill  # noqa: E402
from slurm_elastic.daemon.service import with_progress  # noqa: E402
from slurm_elastic.types import ProgressReport  # noqa: E402
from tests.slurm_cluster import SlurmCluster, wait_until  # noqa: E402
from tests.test_agent_e2e import (  # noqa: E402
    TrainingJob,
    assert_exactly_once,
    at_world,
    drill,  # noqa: F401  (the fixture)
)
from tests.test_hostile_jobdir import RUNUSER, SYSTEM_PYTHON, users  # noqa: E402, F401

ATTACK = Path(__file__).with_name("outside_kill_attack.py")
REQUESTS = 50


@pytest.mark.slurm
@pytest.mark.torch
def test_fifty_outside_kill_requests_leave_a_torchft_job_training_to_completed(
    clean_queue: SlurmCluster,
    drill: ResizeDrill,  # noqa: F811
    users: tuple[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    _alice, bob = users
    # Somewhere bob may read the attack from (pytest's own directories are root's alone).
    attack_dir = Path(tempfile.mkdtemp(prefix="se-attack-"))
    attack_dir.chmod(0o755)
    script = attack_dir / ATTACK.name
    shutil.copy(ATTACK, script)
    script.chmod(0o644)
    job = TrainingJob(
        clean_queue, tmp_path, drill.url, epochs=3, run_options="--mode torchft", nodes=3
    )
    attack: subprocess.Popen[str] | None = None
    try:
        job.wait_records(at_world(3, min_step=5), "training at 3 nodes")
        launch = json.loads(
            (tmp_path / ".slurm-elastic" / f"job-{job.job_id}" / "launch.json").read_text()
        )
        attacked_at = time.time()
        # The attack runs beside the job: a scan finding nothing takes a second or two, so
        # bob is still at it when the job, long past its fallback, completes.
        attack = subprocess.Popen(
            [RUNUSER, "-u", bob, "--", SYSTEM_PYTHON, str(script), launch["rdzv_host"],
             str(PORT_BASE), str(PORT_BASE + PORT_SPAN), str(REQUESTS), "0.25"],
            env={"PATH": "/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # What status shows for the job while it trains on: its reports' fallback, in the
        # daemon's words (the store forgets a job once it has ended).
        seen: list[ProgressReport] = []

        def reported() -> bool:
            latest = drill.reports.latest(job.job_id)
            if latest is not None and latest.fallback is not None:
                seen.append(latest)
            return bool(seen) or job.state() not in {"PENDING", "RUNNING", "COMPLETING"}

        wait_until(reported, 120, "a report naming the fallback")
        assert job.wait_finished() == "COMPLETED", job.log_text()[-3000:]
        out, err = attack.communicate(timeout=240)
        assert attack.returncode == 0, err[-2000:]
        counts = json.loads(out.splitlines()[-1])
    finally:
        if attack is not None and attack.poll() is None:
            attack.kill()
        clean_queue.run("scancel", str(job.job_id), check=False)
        shutil.rmtree(attack_dir, ignore_errors=True)

    print(f"outside kills: bob's {counts}")
    assert counts["requests"] == REQUESTS
    # The attack landed: the lighthouse was found and groups were killed through it.
    assert counts["ports_found"] == [launch["rdzv_port"]], counts
    assert counts["posted"] >= OUTSIDE_KILL_LIMIT, counts
    log = job.log_text()
    kills = log.count("got kill request")
    assert kills >= OUTSIDE_KILL_LIMIT, log[-3000:]
    assert '"agent.fallback"' in log and '"relaunches_left": 2' in log, log[-3000:]
    after = json.loads(
        (tmp_path / ".slurm-elastic" / f"job-{job.job_id}" / "launch.json").read_text()
    )
    assert (after["mode"], after["fallback"]) == ("torchrun", "outside_kills")
    records = job.records()
    assert_exactly_once(records, samples=2400, epochs=job.epochs)
    fell_back = next(
        datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp()
        for line in log.splitlines()
        if '"agent.fallback"' in line
    )
    resumed = min(r["t"] for r in records if r["t"] > fell_back)  # trained on after it
    print(
        f"outside kills: {kills} groups killed, fallback {fell_back - attacked_at:.1f}s after "
        f"the attack began, training again {resumed - fell_back:.1f}s later; job "
        f"{max(r['t'] for r in records) - min(r['t'] for r in records):.0f}s of training"
    )
    assert seen and seen[0].fallback == "outside_kills", "no report named the fallback"
    row = with_progress({"job_id": job.job_id, "reason": ""}, seen[0])
    assert _status_row(row)[-1] == FALLBACK_TEXT["outside_kills"]
