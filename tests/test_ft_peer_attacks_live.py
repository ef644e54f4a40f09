"""Issue 38, class 5, live: an outsider as a *peer* of a torchft-mode job, from the login
host, while the job trains on 3 nodes: first an invented replica group in its quorums, then
garbage written into its groups' stores (``ft_peer_attack.py`` says how), ``ATTACK_S``
seconds each.

What each costs the job is measured and printed (docs/security.md quotes it): the steps it
committed during the attack, how long after it the job trained again, the relaunches it
spent and how it ended.  (The attacker runs as root only because torch and torchft are
installed in root's home here; each call it makes is an unauthenticated network request that
any user with torchft could make.)
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchft")

from slurm_elastic.agent.rendezvous import PORT_BASE, PORT_SPAN  # noqa: E402
from slurm_elastic.daemon.drill import ResizeDrill  # noqa: E402
from tests.slurm_cluster import SlurmCluster  # noqa: E402
from tests.test_agent_e2e import (  # noqa: E402
    TrainingJob,
    assert_exactly_once,
    assert_same_weights,
    at_world,
    drill,  # noqa: F401  (the fixture)
    reference_weights,
)

ATTACK = Path(__file__).with_name("ft_peer_attack.py")
ATTACK_S = 20.0
EPOCHS = 8  # long enough to train through both attacks and after them


def first_records(records: list[dict]) -> list[tuple[float, int]]:
    """(when, step) of each step's first record, any rank or generation, in time order."""
    first: dict[int, float] = {}
    for r in records:
        first[r["step"]] = min(first.get(r["step"], r["t"]), r["t"])
    return sorted((t, step) for step, t in first.items())


def attack(job: TrainingJob, host: str, mode: str) -> tuple[dict, float, float]:
    """Run one attack; (what the attacker reports, when it began, when it ended)."""
    began = time.time()
    done = subprocess.run(
        [sys.executable, str(ATTACK), mode, host, str(PORT_BASE), str(PORT_BASE + PORT_SPAN),
         str(ATTACK_S)],
        capture_output=True, text=True, timeout=ATTACK_S + 120, check=False,
    )  # fmt: skip
    ended = time.time()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1]), began, ended


@pytest.mark.slurm
@pytest.mark.torch
@pytest.mark.default_slurm_only(
    "the attacks are on torchft's and torch's listeners, which Slurm has no part in; the "
    "job's Slurm side (a 3-node torchft job, its steps) is test_outside_kills_live's on "
    "every version"
)
def test_what_an_outside_peer_costs_a_torchft_job(
    clean_queue: SlurmCluster,
    drill: ResizeDrill,  # noqa: F811
    tmp_path: Path,
) -> None:
    job = TrainingJob(
        clean_queue, tmp_path, drill.url, epochs=EPOCHS, run_options="--mode torchft", nodes=3
    )
    phases: dict[str, tuple[dict, float, float]] = {}
    try:
        job.wait_records(at_world(3, min_step=5), "training at 3 nodes")
        launch = json.loads(
            (tmp_path / ".slurm-elastic" / f"job-{job.job_id}" / "launch.json").read_text()
        )
        for mode in ("replica", "store"):
            phases[mode] = attack(job, launch["rdzv_host"], mode)
            ended = phases[mode][2]
            job.wait_records(
                lambda recs, ended=ended: any(t > ended + 1 for t, _ in first_records(recs)),
                f"training again after the {mode} attack",
            )
        state = job.wait_finished()
    finally:
        clean_queue.run("scancel", str(job.job_id), check=False)
        (tmp_path.parent / "peer-attack-job.log").write_text(job.log_text())  # for a look
    records = job.records()
    steps = first_records(records)
    log = job.log_text()
    for mode, (counts, began, ended) in phases.items():
        during = [s for t, s in steps if began <= t < ended]
        again = min(t for t, _ in steps if t > ended) - ended
        times = [t for t, _ in steps if began - 5 <= t <= ended + again]
        stalled = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
        print(
            f"\npeer attack {mode}: {counts}; new steps reached during its {ATTACK_S:.0f}s: "
            f"{len(during)}; longest stall {stalled:.1f}s; training again {again:.1f}s after it"
        )
    print(
        f"peer attacks: job {state}; relaunches_left {re.findall(r'relaunches_left.: (.)', log)};"
        f" not committed {log.count('step_not_committed')}; participants "
        f"{sorted(set(re.findall(r'.participants.: (.)', log)))}"
    )
    assert state == "COMPLETED", log[-4000:]
    # Neither attack ended a group or spent a relaunch: they cost quorums, not the job.
    assert '"relaunches_left"' not in log and "got kill request" not in log, log[-4000:]
    # The invented replica spoiled quorums (each group saw it fail and ran no step in it);
    # no group ever trained in a quorum it had failed, so what the samples say was trained
    # is what the model was trained on: every sample once per epoch, the unresized weights.
    failed = {
        (node, int(quorum))
        for quorum, node in re.findall(r"trainer\.quorum_failed .* quorum=(\d+) replica=(n\d)", log)
    }
    assert failed, log[-4000:]
    trained_in = {(r["node"], r["gen"] // 1000) for r in records}  # Membership.generation
    assert not failed & trained_in, sorted(failed & trained_in)
    assert_exactly_once(records, samples=2400, epochs=job.epochs)
    assert_same_weights(torch.load(tmp_path / "final.pt"), reference_weights(tmp_path, EPOCHS))
