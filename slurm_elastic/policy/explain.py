"""Turn a choice of candidates into a ``Plan`` with one explanation per job.

``rule`` names the reason the job is not one size larger (stable short names):

* ``frozen``            guard rails pinned the job at its current size this cycle
* ``static``            the static baseline never resizes
* ``max``               at its largest allowed size
* ``payback``           larger sizes exist but none gains enough to pay back its cost
                        within the horizon (or progress is capped: the job finishes anyway)
* ``capacity``          the next size does not fit: a capacity row is full
* ``fifo-reservation``  the next size would take nodes a pending job ahead in Slurm's
                        queue waits for
* ``reclaim``           the job shrinks to give back nodes on loan (above its entitlement)
                        to a pending job ahead of it in Slurm's queue; the detail names the
                        row (``reclaim:<partition>:job<ID>``: the pending job)
* ``promise``           the next size would grow into nodes a job with a begin time soon
                        will need (``promise:<partition>``)
* ``marginal-gain``     it fits, but the policy gave the nodes to jobs that gain more
* ``no-change``         every policy failed; current sizes are kept
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from slurm_elastic.policy.compiled import RECLAIM, Compiled, IntArray, JobModel
from slurm_elastic.types import Decision, Explanation, Plan, SolverStatus, WeighedSizes

_EPS = 1e-9


def _detail(job: JobModel, target: int) -> str:
    cur = job.demand.current_nodes
    if cur == 0:
        return f"start at {target}" if target else "stay pending"
    if target == cur:
        return f"keep {cur}"
    return f"{'grow' if target > cur else 'shrink'} {cur}->{target}"


def _rules(
    compiled: Compiled, at: IntArray, targets: list[int], solver: str
) -> list[tuple[str, str, int | None]]:
    """Why each job is not one candidate larger, and for a reclaim the job it gives back to
    (vectorised over jobs; ``at`` is the flat index of each job's choice, ``targets`` its
    size)."""
    jobs = compiled.jobs
    start = compiled.start
    has_next = at + 1 < start[1:]
    nxt = np.where(has_next, at + 1, at)
    coef = compiled.coef
    usage = coef[:, at].sum(axis=1)  # zeros per row when there are no jobs
    delta = coef[:, nxt] - coef[:, at]
    over = (usage[:, None] + delta > compiled.rhs[:, None] + _EPS) & (delta > 0)
    blocked = over.any(axis=0).tolist()
    first = over.argmax(axis=0).tolist() if over.shape[0] else [0] * len(jobs)
    larger = compiled.sizes[nxt].tolist()
    # A shrink that a reclaim row counts (its usage there drops): the first such row.
    reclaims = [r for r, row in enumerate(compiled.rows) if row.kind == RECLAIM]
    if reclaims:
        gives = coef[reclaims][:, at] < coef[reclaims][:, compiled.keep] - _EPS
        gives_to: list[int | None] = [
            next((reclaims[k] for k in np.flatnonzero(col)), None) for col in gives.T
        ]
    else:
        gives_to = [None] * len(jobs)
    out: list[tuple[str, str, int | None]] = []
    for i, (job, more) in enumerate(zip(jobs, has_next.tolist(), strict=True)):
        cur = job.demand.current_nodes
        given_to = gives_to[i]
        if given_to is not None and targets[i] < cur:
            loan = cur - job.demand.reclaim_floor
            row = compiled.rows[given_to]
            # What the reclaim takes: the loan, rounded down to the job's grid; a shrink
            # past it is the objective's choice (its nodes fund a larger start).
            given = min(cur - targets[i], cur - job.demand.reclaim_grid_floor)
            why = f"gives back {given} of {loan} on loan to {row.name}"
            if cur - targets[i] > given:
                why += f" and {cur - targets[i] - given} more"
            out.append(("reclaim", why, row.reserver))
        elif job.demand.frozen and targets[i] == cur:
            out.append(("frozen", "", None))
        elif solver in ("static", "no-change"):
            out.append((solver, "", None))
        elif not more:
            if targets[i] >= int(job.legal[-1]):  # legal sizes ascend
                out.append(("max", "", None))
            else:
                why = "no larger size gains more than it costs in the horizon"
                out.append(("payback", why, None))
        elif blocked[i]:
            row = compiled.rows[first[i]]
            out.append((row.kind, f"{larger[i]} nodes would overfill {row.name}", None))
        else:
            out.append(("marginal-gain", f"{larger[i]} nodes fit but gain less elsewhere", None))
    return out


def build_plan(
    compiled: Compiled,
    choice: Sequence[int],
    *,
    solver: str,
    status: SolverStatus,
    gap: float = 0.0,
    solve_s: float = 0.0,
    note: str = "",
) -> Plan:
    horizon = compiled.problem.horizon_s
    # Each job's numbers at its choice, gathered from the flat arrays in one go (a numpy
    # scalar per job and field costs more than the whole gather on ~16 jobs).
    at = compiled.at(choice)
    targets = compiled.sizes[at].tolist()
    speed = compiled.throughput[at].tolist()
    gain = (compiled.progress[at] - compiled.progress[compiled.keep]).tolist()
    rules = _rules(compiled, at, targets, solver)
    decisions = []
    for i, job in enumerate(compiled.jobs):
        target = targets[i]
        d = job.demand
        resized = d.is_running and target != d.current_nodes
        cost = float(_resize_cost(speed[i], d.outlook.resize_cost_s, horizon)) if resized else 0.0
        rule, why, waiting = rules[i]
        what = _detail(job, target)  # never empty
        detail = f"{what}; {why}" if why else what
        decisions.append(
            Decision(
                job_id=d.job_id,
                current_nodes=d.current_nodes,
                target_nodes=target,
                explanation=Explanation(
                    predicted_gain=gain[i],
                    resize_cost=cost,
                    rule=rule,
                    detail=detail,
                    waiting_job=waiting,
                ),
            )
        )
    weighed = weighed_sizes(compiled)
    if compiled.placed:
        shown = _placements_chosen(compiled, targets)
        demands = compiled.problem.elastic
        decisions = [
            # A demand placed in several partitions is told which one it starts in.
            replace(decisions[j], partition=compiled.jobs[j].demand.partition)
            if demands[compiled.owner[j]].options and targets[j] > 0
            else decisions[j]
            for j in shown
        ]
        weighed = _only(weighed, shown)
    return Plan(
        decisions=tuple(decisions),
        solver=solver,
        status=status,
        objective=float(compiled.value[at].sum()),
        gap=float(gap) if np.isfinite(gap) else 0.0,
        solve_s=solve_s,
        note=note,
        weighed=weighed,
    )


def _placements_chosen(compiled: Compiled, targets: Sequence[int]) -> list[int]:
    """Per demand, the compiled job that speaks for it: the placement it starts in, else
    (staying pending) its first."""
    chosen: dict[int, int] = {}
    for j, demand in enumerate(compiled.owner):
        if demand not in chosen or (targets[j] > 0 and targets[chosen[demand]] == 0):
            chosen[demand] = j
    return [chosen[demand] for demand in sorted(chosen)]


def _only(weighed: WeighedSizes, jobs: Sequence[int]) -> WeighedSizes:
    """The sizes weighed for the given compiled jobs only, in that order."""
    start: list[int] = [0]
    picked: list[int] = []
    for j in jobs:
        a, b = weighed.start[j], weighed.start[j + 1]
        picked.extend(range(a, b))
        start.append(start[-1] + b - a)
    return WeighedSizes(
        start=tuple(start),
        nodes=tuple(weighed.nodes[i] for i in picked),
        steps_per_s=tuple(weighed.steps_per_s[i] for i in picked),
        predicted_gain=tuple(weighed.predicted_gain[i] for i in picked),
        resize_cost=tuple(weighed.resize_cost[i] for i in picked),
    )


def _resize_cost(steps_per_s: Any, resize_cost_s: Any, horizon_s: float) -> Any:
    """Progress a resize loses: the rate at the new size times the restart's seconds (within
    the horizon).  Scalars or arrays alike."""
    return steps_per_s * np.minimum(resize_cost_s, horizon_s)


def weighed_sizes(compiled: Compiled) -> WeighedSizes:
    """Every job's candidates with their rate, gain over keeping its size, and resize cost:
    each candidate's figures as a decision at that size would have them, for all at once."""
    n = len(compiled.jobs)
    job_of = np.repeat(np.arange(n), np.diff(compiled.start))
    demands = [job.demand for job in compiled.jobs]
    current = np.fromiter((d.current_nodes for d in demands), dtype=np.int64, count=n)
    running = np.fromiter((d.is_running for d in demands), dtype=bool, count=n)
    restart_s = np.fromiter((d.outlook.resize_cost_s for d in demands), dtype=float, count=n)
    moved = running[job_of] & (compiled.sizes != current[job_of])
    cost = _resize_cost(compiled.throughput, restart_s[job_of], compiled.problem.horizon_s)
    gain = compiled.progress - compiled.progress[compiled.keep][job_of]
    return WeighedSizes(
        start=tuple(compiled.start.tolist()),
        nodes=tuple(compiled.sizes.tolist()),
        steps_per_s=tuple(compiled.throughput.tolist()),
        predicted_gain=tuple(gain.tolist()),
        resize_cost=tuple(np.where(moved, cost, 0.0).tolist()),
    )


def no_change_choice(compiled: Compiled) -> list[int]:
    """Running jobs keep their size, pending jobs stay pending."""
    return [job.keep for job in compiled.jobs]
