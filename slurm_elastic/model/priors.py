"""Cold-start priors from the site's own accounting history.

Before a job has reported anything, the best guide to it is the same user's earlier runs
of the same thing.  "Similar" is decided in this order (the first non-empty level wins):

1. same user, same job name and same working directory;
2. same user and same job name;
3. same user and same working directory (the same script run under another name).

Every level is the same user's, on purpose: names, working directories and comments are
whatever a user writes, so drawing on other users' jobs would let one user steer the
estimates that size another's (docs/security.md, "What a user can put in Slurm's
output").  The user is the one Slurm recorded for the job, never a field a user wrote.

From the similar jobs we take the run time (``COMPLETED`` runs; other finished runs only
when no completed one exists, since a cancelled run says little about its natural
length), the sizes they ran at, and, where the daemon kept their progress reports, the
throughput per size and the steps they finished with.

When nothing is similar, ``SiteDefaults`` apply (documented in the README): 4 h of work at
the requested size, 1 s per step at that size, the ``DEFAULT_SHAPE`` scaling curve and a
60 s restart cost.  All of them are configuration, not truths.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurm_elastic.model.throughput import (
    DEFAULT_SHAPE,
    ScalingParams,
    fit_throughput,
    prior_params,
)
from slurm_elastic.types import JobHistory, JobState

MAX_SIMILAR = 20  # most recent similar jobs considered


@dataclass(frozen=True, slots=True)
class SiteDefaults:
    """Fallbacks when a job has no similar history (all configurable)."""

    runtime_s: float = 4 * 3600.0
    step_time_s: float = 1.0  # nominal seconds per step on one node
    scaling_shape: tuple[float, ...] = DEFAULT_SHAPE
    resize_cost_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Prior:
    """What history says about a job before (or while) it reports.

    ``runtime_s`` is the typical whole run time at ``reference_nodes``.  ``scaling`` is in
    real steps/s when ``scaling_measured`` (fitted from past reports), else in *nominal*
    steps (1 step = ``SiteDefaults.step_time_s`` at the reference size), which keeps remaining
    seconds consistent across sizes even though the step unit is made up.
    """

    runtime_s: float
    reference_nodes: int
    scaling: ScalingParams
    scaling_measured: bool
    total_steps: float | None  # median finished steps of similar jobs, when known
    sizes_used: tuple[int, ...]
    n_similar: int
    source: str  # "history" | "site"

    def work_steps(self) -> float:
        """Whole-run work in the prior's step unit."""
        if self.total_steps is not None and self.scaling_measured:
            return self.total_steps
        return self.runtime_s * self.scaling.throughput(self.reference_nodes)


class HistoryIndex:
    """Finished jobs grouped by the keys of the similarity levels, kept up to date.

    ``update`` takes what one accounting read changed (O(changes)); a look-up then costs
    O(similar jobs), where a scan of the whole history per job made the daemon's prior
    look-ups grow with the accounting look-back.  Ties in end time keep the order in which
    jobs entered the history, as a stable sort of it would.
    """

    def __init__(self, history: Iterable[JobHistory] = ()) -> None:
        self._seq: dict[int, int] = {}  # job id -> rank of its first entry (dict order)
        self._jobs: dict[int, JobHistory] = {}
        self._next = 0
        self._buckets: dict[tuple[str, ...], dict[int, JobHistory]] = {}
        self._sorted: dict[tuple[str, ...], list[JobHistory]] = {}  # newest first, capped
        self.update(history)

    def update(self, records: Iterable[JobHistory] = (), removed: Iterable[int] = ()) -> None:
        """Records read (new or newer views of known jobs), then job ids dropped."""
        for h in records:
            old = self._jobs.get(h.job_id)
            if old is not None:
                self._unfile(old)
            else:
                self._seq[h.job_id] = self._next
                self._next += 1
            self._jobs[h.job_id] = h
            self._file(h)
        for job_id in removed:
            gone = self._jobs.pop(job_id, None)
            if gone is not None:
                self._unfile(gone)
                del self._seq[job_id]

    @staticmethod
    def _keys(h: JobHistory) -> list[tuple[str, ...]]:
        if not h.state.is_finished:
            return []
        keys: list[tuple[str, ...]] = []
        if h.name and h.work_dir:
            keys.append(("name+dir", h.user, h.name, h.work_dir))
        if h.name:
            keys.append(("name", h.user, h.name))
        if h.work_dir:
            keys.append(("dir", h.user, h.work_dir))
        return keys

    def _file(self, h: JobHistory) -> None:
        for key in self._keys(h):
            self._buckets.setdefault(key, {})[h.job_id] = h
            self._sorted.pop(key, None)

    def _unfile(self, h: JobHistory) -> None:
        for key in self._keys(h):
            bucket = self._buckets[key]
            del bucket[h.job_id]
            if not bucket:
                del self._buckets[key]
            self._sorted.pop(key, None)

    def _newest(self, key: tuple[str, ...]) -> list[JobHistory]:
        found = self._sorted.get(key)
        if found is None:
            seq = self._seq
            found = sorted(
                self._buckets.get(key, {}).values(),
                key=lambda h: (-(h.end_time or h.start_time or 0.0), seq[h.job_id]),
            )[:MAX_SIMILAR]
            self._sorted[key] = found
        return found

    def similar(self, user: str, name: str, work_dir: str) -> list[JobHistory]:
        """Finished jobs like this one, most recent first (see the module doc for the order)."""
        levels = (
            ("name+dir", user, name, work_dir) if name and work_dir else None,
            ("name", user, name) if name else None,
            ("dir", user, work_dir) if work_dir else None,
        )
        for key in levels:
            if key is not None and key in self._buckets:
                return list(self._newest(key))
        return []


def similar_jobs(
    user: str, name: str, work_dir: str, history: Iterable[JobHistory]
) -> list[JobHistory]:
    """Finished jobs like this one, most recent first (see the module doc for the order)."""
    return HistoryIndex(history).similar(user, name, work_dir)


def _runtime(h: JobHistory) -> float | None:
    if h.start_time is None or h.end_time is None:
        return None
    d = h.end_time - h.start_time
    return d if d > 0 else None


def _main_size(h: JobHistory) -> int | None:
    """The size the job spent most node-time at."""
    best: tuple[float, int] | None = None
    for a in h.allocations:
        if a.node_count <= 0:
            continue
        span = (a.end - a.start) if a.start is not None and a.end is not None else 0.0
        key = (max(span, 0.0), a.node_count)
        if best is None or key > best:
            best = key
    return best[1] if best else None


def site_prior(requested_nodes: int, site: SiteDefaults = SiteDefaults()) -> Prior:
    n = max(int(requested_nodes), 1)
    nominal = prior_params(n, site.step_time_s, site.scaling_shape)
    return Prior(
        runtime_s=site.runtime_s,
        reference_nodes=n,
        scaling=nominal,
        scaling_measured=False,
        total_steps=None,
        sizes_used=(),
        n_similar=0,
        source="site",
    )


def build_prior(
    *,
    user: str,
    name: str,
    work_dir: str,
    requested_nodes: int,
    history: Iterable[JobHistory] | HistoryIndex,
    past_throughput: Mapping[int, Sequence[tuple[int, float]]] | None = None,
    past_steps: Mapping[int, float] | None = None,
    site: SiteDefaults = SiteDefaults(),
) -> Prior:
    """Prior for one job from similar finished jobs, else the site default.

    ``history`` is the finished jobs, or a ``HistoryIndex`` of them when many priors are
    built from the same history.  ``past_throughput`` maps an old job id to its observed
    ``(nodes, steps/s)`` points and ``past_steps`` to the step it finished at (both kept
    by the daemon from reports).
    """
    index = history if isinstance(history, HistoryIndex) else HistoryIndex(history)
    return prior_from_similar(
        index.similar(user, name, work_dir),
        requested_nodes,
        past_throughput=past_throughput,
        past_steps=past_steps,
        site=site,
    )


def prior_from_similar(
    similar: Sequence[JobHistory],
    requested_nodes: int,
    *,
    past_throughput: Mapping[int, Sequence[tuple[int, float]]] | None = None,
    past_steps: Mapping[int, float] | None = None,
    site: SiteDefaults = SiteDefaults(),
    speed: Callable[[JobHistory], float] | None = None,
) -> Prior:
    """``build_prior`` once the similar jobs are found (``HistoryIndex.similar``): a pure
    function of them (immutable records) and the other arguments.

    ``speed``: how fast the GPUs a finished job ran on were, relative to the reference 1.0
    (``daemon.placement``).  Each run time is then brought to the reference speed (times
    that speed: a run of an hour on GPUs twice as fast is two hours of reference GPUs), so
    that jobs that ran on different hardware make one prior.  None: all alike."""
    if not similar:
        return site_prior(requested_nodes, site)
    completed = [h for h in similar if h.state is JobState.COMPLETED]
    pool = completed or similar
    runtimes = [
        r * (speed(h) if speed is not None else 1.0) for h in pool if (r := _runtime(h)) is not None
    ]
    sizes = [s for s in (_main_size(h) for h in pool) if s is not None]
    if not runtimes:
        return site_prior(requested_nodes, site)
    ref = int(statistics.median_low(sizes)) if sizes else max(int(requested_nodes), 1)

    pts_n: list[float] = []
    pts_f: list[float] = []
    steps: list[float] = []
    for h in pool:
        for n_, f_ in (past_throughput or {}).get(h.job_id, ()):
            pts_n.append(float(n_))
            pts_f.append(float(f_))
        s = (past_steps or {}).get(h.job_id)
        if s is not None and s > 0:
            steps.append(float(s))
    fitted = fit_throughput(pts_n, pts_f) if pts_n else None
    nominal = prior_params(ref, site.step_time_s, site.scaling_shape)
    return Prior(
        runtime_s=float(statistics.median(runtimes)),
        reference_nodes=ref,
        scaling=fitted.params if fitted else nominal,
        scaling_measured=fitted is not None,
        total_steps=float(statistics.median(steps)) if steps and fitted else None,
        sizes_used=tuple(sorted(set(sizes))),
        n_similar=len(pool),
        source="history",
    )
