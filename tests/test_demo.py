"""``make demo``: the quick demo end to end on the real cluster, its clean stop on SIGINT,
and the pure pieces it is built from (size timelines, measured speeds, batch scripts).

The end-to-end test runs ``python -m slurm_elastic.demo --quick`` exactly as a user would
(real daemon subprocess, real torch jobs under ``slurm-elastic run``, real companion
jobs) and checks what it observed in Slurm: at least one start-at-size, one shrink and one
grow, every job completed, the simulated static comparison present, nothing left running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_elastic.demo.compare import MixJob, measured_rates, simulate_mix
from slurm_elastic.demo.observe import Observer, segments
from slurm_elastic.demo.workload import FULL, QUICK, batch_script
from slurm_elastic.errors import ConfigError
from slurm_elastic.types import ClusterSnapshot, JobState, JobView
from tests.slurm_cluster import SlurmCluster, wait_until

REPO = Path(__file__).resolve().parent.parent
DEMO = [sys.executable, "-m", "slurm_elastic.demo"]


def _needs_four_nodes(cluster: SlurmCluster) -> None:
    if len(cluster.nodes) != 4:
        pytest.skip("the demo runs on a 4-node instance (SLURM_ELASTIC_TEST_NODES=4)")


def _daemon_pids(out: Path) -> list[int]:
    """Processes running `slurm-elastic daemon --config <out>/daemon.yaml`."""
    needle = str(out / "daemon.yaml").encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and needle in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


@pytest.mark.slurm
@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.demo_slurm_only(
    "its Slurm calls (start-at-size pins, NumNodes shrinks, companion grows, cancels) are "
    "the daemon's and the launcher's, which the live daemon and end-to-end tests make on "
    "every version; `make demo SLURM=22.05|26.05` was run by hand (docs/benchmarks.md)"
)
def test_quick_demo_shows_start_at_size_shrink_grow(clean_queue: SlurmCluster, tmp_path: Path):
    pytest.importorskip("torch")
    _needs_four_nodes(clean_queue)
    out = tmp_path / "demo-out"
    which = ["--slurm", clean_queue.version, "--instance", str(clean_queue.instance)]
    argv = [*DEMO, "--quick", *which, "--out", str(out)]
    done = subprocess.run(
        argv, cwd=REPO, env=clean_queue.env, capture_output=True, text=True, timeout=420
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    counts = summary["counts"]
    assert counts["start_at_size"] >= 1, done.stdout[-4000:]
    assert counts["shrink"] >= 1, done.stdout[-4000:]
    assert counts["grow"] >= 1, done.stdout[-4000:]
    assert summary["all_completed"], [(j["name"], j["state"]) for j in summary["jobs"]]
    assert {j["name"] for j in summary["jobs"]} == {j.name for j in QUICK}
    for job in summary["jobs"]:
        assert job["state"] == "COMPLETED" and job["completion_s"] > 0
        if job["kind"] == "elastic":
            assert job["done_steps"] == job["total_steps"], job  # trained to the end
            assert job["steps_per_s"], f"{job['name']}: no speed measured"
    # Stop-free by default: the workers that stayed paused, none restarted.
    assert summary["resize_mode"] == "torchft"
    survivors = summary["survivors"]
    assert survivors["pauses"] >= 1 and survivors["restarted"] == 0, survivors
    assert "the workers that stayed paused" in done.stdout, done.stdout[-4000:]
    assert f"({counts['shrink'] + counts['grow']} resizes)" in done.stdout, done.stdout[-4000:]
    sim = summary["simulated"]
    assert sim["label"].startswith("SIMULATED")
    assert set(sim["static"]["jobs"]) == {j.name for j in QUICK}
    assert "SIMULATED" in done.stdout and "start-at-size" in done.stdout
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Nothing left behind: no demo job or companion, no daemon.
    assert clean_queue.active_job_ids() == []
    assert _daemon_pids(out) == []


@pytest.mark.slurm
@pytest.mark.slow
def test_sigint_stops_daemon_and_cancels_jobs(clean_queue: SlurmCluster, tmp_path: Path):
    _needs_four_nodes(clean_queue)
    out = tmp_path / "demo-out"
    which = ["--slurm", clean_queue.version, "--instance", str(clean_queue.instance)]
    argv = [*DEMO, "--quick", *which, "--out", str(out)]
    proc = subprocess.Popen(
        argv, cwd=REPO, env=clean_queue.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        wait_until(lambda: len(clean_queue.active_job_ids()) >= 2, 90, "two demo jobs")
        assert _daemon_pids(out), "the daemon is not running"
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output[-3000:]
    assert "interrupted (SIGINT)" in output
    assert clean_queue.active_job_ids() == [], output[-3000:]
    assert _daemon_pids(out) == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted (SIGINT)"
    assert not summary["all_completed"]


# --------------------------------------------------------------------------- pure pieces


def _job(job_id: int, state: JobState, nodes: int, comment: str = "elastic", lo=1, hi=3):
    running = state is JobState.RUNNING
    return JobView(
        job_id=job_id,
        name=f"j{job_id}",
        user="root",
        user_id=0,
        account="default",
        partition="batch",
        qos="normal",
        state=state,
        state_reason="None" if running else "Resources",
        node_count=nodes,
        min_nodes=nodes if running else lo,
        max_nodes=None if running else hi,
        nodes=tuple(f"n{i}" for i in range(1, nodes + 1)) if running else (),
        batch_host="n1" if running else None,
        comment=comment,
    )


def _snap(t: float, *jobs: JobView) -> ClusterSnapshot:
    return ClusterSnapshot(taken_at=t, jobs=jobs, nodes=(), partitions=())


def test_observer_reads_start_at_size_shrink_grow_end_from_the_queue() -> None:
    from slurm_elastic.demo.observe import JobTrack

    obs = Observer()
    obs.track(JobTrack(7, "mlp", True, (1, 3), 100.0))
    companion = "slurm-elastic:companion-of=7"
    kinds = []
    for snap in (
        _snap(101, _job(7, JobState.PENDING, 1)),  # submitted 1-3
        _snap(102, _job(7, JobState.PENDING, 2, lo=2, hi=2)),  # the daemon pinned 2-2
        _snap(103, _job(7, JobState.RUNNING, 2)),
        _snap(110, _job(7, JobState.RUNNING, 1)),  # shrunk with NumNodes=1
        _snap(120, _job(7, JobState.RUNNING, 1), _job(8, JobState.PENDING, 2, companion)),
        _snap(125, _job(7, JobState.RUNNING, 1), _job(8, JobState.RUNNING, 2, companion)),
        _snap(140, _job(7, JobState.COMPLETED, 1), _job(8, JobState.RUNNING, 2, companion)),
    ):
        kinds += [(e.kind, e.from_nodes, e.to_nodes) for e in obs.add(snap)]
    assert kinds == [
        ("start_at_size", 0, 2),
        ("shrink", 2, 1),
        ("grow", 1, 3),
        ("end", 3, 0),
    ]
    track = obs.tracks[7]
    assert track.companions == {8}
    assert segments(track, 200.0) == [(103, 110, 2), (110, 125, 1), (125, 140, 3)]


def test_a_job_slurm_starts_unpinned_is_a_plain_start() -> None:
    from slurm_elastic.demo.observe import JobTrack

    obs = Observer()
    obs.track(JobTrack(3, "w", True, (1, 3), 0.0))
    events = obs.add(_snap(1, _job(3, JobState.RUNNING, 3)))
    assert [(e.kind, e.to_nodes) for e in events] == [("start", 3)]


def test_measured_rates_skip_the_restart_and_keep_each_size() -> None:
    # 4 steps/s at 2 nodes from t=0, a shrink at t=30, 2 steps/s at 1 node after 5 s of restart
    progress = [(float(t), 4 * t) for t in range(0, 30, 2)]
    progress += [(float(t), 116 + 2 * (t - 35)) for t in range(36, 70, 2)]
    rates = measured_rates(progress, [(0.0, 2), (30.0, 1)], settle_s=8.0)
    assert rates == pytest.approx({2: 4.0, 1: 2.0})
    assert measured_rates([(1.0, 5)], [(0.0, 2)]) == {}


def test_simulated_static_keeps_sizes_and_queues_the_late_job() -> None:
    from slurm_elastic.config import Config

    config = Config.model_validate({"mode": "enforce", "interval_s": 3})
    mix = [
        MixJob("a", 0.0, 1, 3, True, 600.0, {1: 2.0, 3: 6.0}),
        MixJob("b", 10.0, 1, 3, True, 300.0, {1: 2.0, 3: 6.0}),
        MixJob("r", 0.0, 1, 1, False, 50.0, {}),
    ]
    result = simulate_mix(mix, 4, config, policies=("static",))
    jobs = result["static"]["jobs"]
    assert {size for _, size in jobs["a"]["sizes"]} == {3}
    # b asks for 3 nodes and must wait for a (100 s at 6 steps/s), then runs 50 s.
    assert jobs["b"]["start_s"] == pytest.approx(100.0, abs=4)
    assert jobs["b"]["jct_s"] == pytest.approx(140.0, abs=5)


def test_batch_scripts_mark_only_elastic_jobs(tmp_path: Path) -> None:
    for job in FULL + QUICK:
        script = batch_script(
            job, python="/usr/bin/python3", example=tmp_path / "t.py", work_dir=tmp_path
        )
        assert script.startswith("#!/bin/bash\n")
        assert f"#SBATCH --nodes={job.nodes_option}" in script
        assert ("#SBATCH --elastic\n" in script) is job.elastic
        assert ("slurm-elastic run --mode torchft -- /usr/bin/python3" in script) is job.elastic
        assert (f"--sample-log {tmp_path}/samples\n" in script) is job.elastic
        restart = batch_script(
            job,
            python="/usr/bin/python3",
            example=tmp_path / "t.py",
            work_dir=tmp_path,
            mode="torchrun",
        )
        assert ("slurm-elastic run --mode torchrun -- " in restart) is job.elastic
    elastic = [j for j in FULL if j.elastic]
    assert len(elastic) >= 3 and any(not j.elastic for j in FULL)
    assert all(j.total_steps and j.total_steps > 100 for j in elastic)


def test_done_steps_and_startup_from_the_jobs_own_output(tmp_path: Path) -> None:
    from slurm_elastic.demo.report import done_steps, startup_s

    # The example's last line, as a real demo job printed it.
    (tmp_path / "slurm-100.out").write_text(
        "trainer.start ...\ndone: steps=800 loss=0.002693 pid=30421\n"
    )
    assert done_steps(tmp_path, [100]) == 800
    assert done_steps(tmp_path, [99]) is None
    # Rank 0 may finish on a companion's node: its line is then in the companion's output.
    (tmp_path / "slurm-200.out").write_text("trainer.start ...\n")
    (tmp_path / "slurm-202.out").write_text("done: steps=400 loss=0.0034 pid=1434\n")
    assert done_steps(tmp_path, [200, 201, 202]) == 400
    # Started at t=10 on 2 nodes at 4 steps/s; the first report at t=30 says step 40:
    # 10 s of training, so 10 s went to srun, torchrun, import torch and the rendezvous.
    assert startup_s([(30.0, 40), (32.0, 48)], [(10.0, 2)], {2: 4.0}) == 10.0
    assert startup_s([], [(10.0, 2)], {2: 4.0}) is None


def test_config_overrides_reach_sections_the_demo_config_lacks(tmp_path: Path) -> None:
    """The chaos run sets grow.orphan_grace_s, a section the demo's config does not write:
    it is added (and validated by the daemon's loader), and a section the demo writes keeps
    the keys an override does not name."""
    from slurm_elastic.demo.harness import write_config

    _path, config = write_config(
        tmp_path,
        9999,
        quick=True,
        overrides={"grow": {"orphan_grace_s": 10}, "guards": {"cooldown_s": 6}},
    )
    assert config.grow.orphan_grace_s == 10
    assert (config.guards.cooldown_s, config.guards.min_dwell_s) == (6, 15)
    with pytest.raises(ConfigError, match=r"grow\.orphan_grace_s"):
        write_config(tmp_path, 9999, quick=True, overrides={"grow": {"orphan_grace_s": -1}})


def _fake_sbatch(bin_dir: Path, answers: list[tuple[int, str]]) -> Path:
    """An ``sbatch`` on PATH that gives ``answers`` in turn (exit status, stderr line); its
    calls are counted in ``calls``.  Past the list it submits job 4242."""
    bin_dir.mkdir()
    calls = bin_dir / "calls"
    cases = "".join(
        f"  {i}) echo {message!r} >&2; exit {status};;\n"
        for i, (status, message) in enumerate(answers, start=1)
    )
    script = bin_dir / "sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f'echo x >> "{calls}"\n'
        f'case $(wc -l < "{calls}") in\n{cases}'
        "  *) echo 4242;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return calls


UNREACHABLE = "sbatch: error: Batch job submission failed: Unable to contact slurm controller"
BUSY = "sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying"
INVALID_ACCOUNT = "sbatch: error: Batch job submission failed: Invalid account"
TIMED_OUT = "sbatch: error: Socket timed out on send/recv operation"


@pytest.mark.parametrize(
    ("answers", "refused", "calls"),
    [
        # "try again" and "no controller reached": nothing can have been submitted.
        ([(1, UNREACHABLE), (1, BUSY)], None, 3),
        # A refusal of the job itself ends the submission at once.
        ([(1, INVALID_ACCOUNT)], ("SlurmRejected", "Invalid account"), 1),
        # A timed-out submission may have been taken: never repeated (as slurm.cli's submit).
        ([(1, TIMED_OUT)], ("SlurmUnreachable", "Socket timed out"), 1),
    ],
    ids=["retried", "refused", "timed-out"],
)
def test_a_submission_slurm_says_to_retry_is_retried_and_a_refusal_is_final(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    answers: list[tuple[int, str]],
    refused: tuple[str, str] | None,
    calls: int,
) -> None:
    """Issue 44 for the demo and the chaos run: 26.05 restarts slurmctld at the demo's
    `scontrol reconfigure`, and an sbatch in those seconds is answered "try again" or not at
    all; it is repeated, while a refusal of the job itself ends the submission at once."""
    from slurm_elastic import errors
    from slurm_elastic.demo import harness

    monkeypatch.setattr(harness, "SUBMIT_RETRY_GAP_S", 0.01)
    counted = _fake_sbatch(tmp_path / "bin", answers)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    args = {"api": "http://127.0.0.1:1", "submit_dir": tmp_path, "mode": "torchrun"}
    if refused is None:
        assert harness.submit_job(QUICK[0], tmp_path / "w", **args) == 4242
    else:
        kind, message = refused
        with pytest.raises(getattr(errors, kind), match=message) as caught:
            harness.submit_job(QUICK[0], tmp_path / "w", **args)
        assert type(caught.value) is getattr(errors, kind)
    assert len(counted.read_text().split()) == calls
