"""Jobs that declare their step budget and jobs that train until converged (issue 17, item 3):
the simulator's workload draw, the curve's stop, and what each kind reports to the daemon."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from slurm_elastic.cli import cli
from slurm_elastic.model.convergence import PATIENCE_EPOCHS, observed_convergence
from slurm_elastic.sim import profiles
from slurm_elastic.sim.cli import simulate
from slurm_elastic.sim.engine import Cluster, ClusterSpec, PartitionSpec, SimJob
from slurm_elastic.sim.runner import report_for
from slurm_elastic.sim.traces import read_trace
from slurm_elastic.sim.workload import BUDGETS, WorkloadConfig, build_workload
from slurm_elastic.types import JobState

CLUSTER06 = "itp_elasticflow/raw/cluster06.csv"
POLLUX = "pollux/workloads/workload-1.csv"


@pytest.fixture(scope="module")
def traces(shared_dir: Path) -> Path:
    return shared_dir / "traces"


def workload(traces: Path, rel: str, budget: str, limit: int = 200):  # type: ignore[no-untyped-def]
    trace = read_trace(traces / rel, limit=limit)
    return build_workload(
        trace,
        WorkloadConfig(budget=budget),
        traces_dir=traces,
        partition_nodes={"p": 64},
        default_partition="p",
    )


def test_the_stop_is_the_criterion_on_the_whole_real_curve(traces: Path) -> None:
    """Where the bench's truth says (scripts/bench_models.py), read from the Pollux file."""
    pollux = traces / "pollux" / "profiles"
    for model in profiles.POLLUX_MODELS:
        b0 = min(profiles._validation_batches(pollux, model))
        with (pollux / model / f"validation-{b0}.csv").open() as f:
            rows = list(csv.DictReader(f))
        metric = [float(r["metric"]) for r in rows]
        stop = observed_convergence(
            np.arange(1, len(metric) + 1),
            metric,
            higher_is_better=metric[-1] > metric[0],
            window=PATIENCE_EPOCHS,
        )
        curve = profiles._curve(pollux, model)
        epochs = len(metric) if stop is None else int(stop)
        assert curve.epoch_at(curve.stop_fraction) == pytest.approx(epochs)
        progress = [float(r["progress"]) for r in rows]
        assert curve.stop_fraction == pytest.approx(progress[epochs - 1] / progress[-1])
    # Known stops (docs/benchmarks.md's table at the smallest batch): cifar10 31, yolov3 38;
    # NCF's 10 epochs never meet it, so its whole curve is the run.
    assert profiles._curve(pollux, "cifar10").epoch_at(0.5) < 50
    assert profiles._curve(pollux, "ncf").stop_fraction == 1.0


def test_the_budget_draw_moves_nothing_else(traces: Path) -> None:
    """declared: every job; converge: none; mix: about half, by a stream of its own, so the
    models, sizes and work of every job are the same under the three."""
    drawn = {b: workload(traces, CLUSTER06, b) for b in BUDGETS}
    assert all(j.declares_budget for j in drawn["declared"].jobs)
    assert not any(j.declares_budget for j in drawn["converge"].jobs)
    share = np.mean([j.declares_budget for j in drawn["mix"].jobs])
    assert 0.4 < share < 0.6
    for b in ("converge", "mix"):
        for mine, declared in zip(drawn[b].jobs, drawn["declared"].jobs, strict=True):
            assert replace(mine, declares_budget=True) == declared  # ITP: work = duration


def test_without_a_duration_a_converge_job_runs_its_curve_to_the_stop(traces: Path) -> None:
    declared = workload(traces, POLLUX, "declared", limit=40).jobs
    converge = workload(traces, POLLUX, "converge", limit=40).jobs
    for d, c in zip(declared, converge, strict=True):
        assert d.work == pytest.approx(d.profile.full_run_steps)
        assert c.work == pytest.approx(d.work * c.profile.curve.stop_fraction)
    assert any(c.work < d.work for d, c in zip(declared, converge, strict=True))


def reports_through(spec):  # type: ignore[no-untyped-def]
    cluster = Cluster(ClusterSpec((PartitionSpec("p", 64),)), (spec,))
    job = SimJob(1, spec, "j", "u", "p", "", 0.0, spec.req_nodes, JobState.RUNNING)
    job.world = spec.req_nodes
    out = []
    for frac in (0.0, 0.5, 1.0):
        job.done = spec.work * frac
        out.append(report_for(job, cluster, now=100.0 * frac))
    return out


def test_a_converge_job_reports_epochs_and_no_budget(traces: Path) -> None:
    """The daemon gets the metric and epochs (its convergence window is 5 epochs) and never
    the step budget; at the end the metric is the curve's at its stop."""
    spec = workload(traces, CLUSTER06, "converge").jobs[0]
    curve = spec.profile.curve
    first, half, last = reports_through(spec)
    assert {r.total_steps for r in (first, half, last)} == {None}
    assert last.epoch == pytest.approx(curve.epoch_at(curve.stop_fraction))
    assert half.epoch == pytest.approx(curve.epoch_at(curve.stop_fraction / 2))
    assert last.loss == pytest.approx(curve.at(curve.stop_fraction))
    declared = replace(spec, declares_budget=True)
    first, half, last = reports_through(declared)
    assert last.total_steps is not None and last.total_steps >= declared.work
    assert {r.epoch for r in (first, half, last)} == {None}
    assert last.loss == pytest.approx(curve.at(1.0))


def test_simulate_says_the_budget(shared_dir: Path, tmp_path: Path) -> None:
    trace = shared_dir / "traces" / CLUSTER06
    args = ["simulate", "--trace", str(trace), "--limit", "30", "--nodes", "16"]
    args += ["--policies", "mip", "--budget", "converge", "--out", str(tmp_path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    said = "budget converge: 0 jobs declare their step budget, 30 train until converged"
    assert said in result.output
    bad = CliRunner().invoke(cli, [*args[:-4], "--budget", "some", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "'some' is not one of" in bad.output
    budget = next(p for p in simulate.params if p.name == "budget")
    assert tuple(budget.type.choices) == BUDGETS  # type: ignore[attr-defined]
