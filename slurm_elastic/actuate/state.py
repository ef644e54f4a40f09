"""What actuation knows about each job, derived from one snapshot (pure).

``classify`` sorts every job of a snapshot into exactly one class:

* an elastic parent (valid marker, not het, not a companion, managed partition) with
  its active companion jobs folded in — the policy sees the parent's *effective* size
  (its own nodes plus its running companions' nodes);
* a companion (``slurm-elastic:companion-of=<PARENT>``) — linked to its parent, or an
  orphan when the parent is gone or no longer running;
* anything else, with the reason it is not elastic ("not elastic", "malformed marker:
  ...", "comment not trusted, ...", "heterogeneous job", ...).  Those jobs are never
  touched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from slurm_elastic.actuate.companion import companion_parent, orphan_reason
from slurm_elastic.errors import MarkerError, OutOfReach
from slurm_elastic.marker import untrusted
from slurm_elastic.types import ClusterSnapshot, ElasticSpec, JobState, JobView

# job -> its spec, None (no marker), or raises MarkerError (malformed marker; OutOfReach
# when its minimum is more than its partitions can ever give).
SpecResolver = Callable[[JobView], ElasticSpec | None]


@dataclass(frozen=True, slots=True)
class ElasticJob:
    job: JobView
    spec: ElasticSpec
    companions: tuple[JobView, ...] = ()  # active companions, oldest first
    # Derived from the fields above once, at construction (the object is immutable): a
    # cycle reads them several times per job, and they were a visible share of its cost.
    _running: tuple[JobView, ...] = field(init=False, repr=False, compare=False)
    _pending: tuple[JobView, ...] = field(init=False, repr=False, compare=False)
    _effective: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Built for every elastic job every cycle, and most have no companion.
        running: tuple[JobView, ...] = ()
        pending: tuple[JobView, ...] = ()
        grown = 0
        if self.companions:
            running = tuple(c for c in self.companions if c.state is JobState.RUNNING)
            pending = tuple(c for c in self.companions if c.state is JobState.PENDING)
            grown = sum(c.node_count for c in running)
        effective = self.job.node_count + grown if self.job.is_running else 0
        object.__setattr__(self, "_running", running)
        object.__setattr__(self, "_pending", pending)
        object.__setattr__(self, "_effective", effective)

    @property
    def running_companions(self) -> tuple[JobView, ...]:
        return self._running

    @property
    def pending_companions(self) -> tuple[JobView, ...]:
        return self._pending

    @property
    def effective_nodes(self) -> int:
        """Nodes the job trains on now: 0 while pending, else its own plus running companions."""
        return self._effective

    @property
    def pending_companion_nodes(self) -> int:
        return sum(c.node_count for c in self.pending_companions)


@dataclass(frozen=True, slots=True)
class Classification:
    elastic: Mapping[int, ElasticJob]
    companions: Mapping[int, int]  # companion job id -> parent id (every active companion)
    orphans: tuple[tuple[JobView, str], ...]  # companion, why it is an orphan
    not_elastic: Mapping[int, str]  # job id -> reason (companions included)
    jobs: Mapping[int, JobView] = field(default_factory=dict)


def classify(
    snapshot: ClusterSnapshot,
    resolve_spec: SpecResolver,
    partition_allowed: Callable[[str], bool] = lambda _p: True,
    previous: Classification | None = None,
) -> Classification:
    """``previous``: the last cycle's classification, whose ElasticJob of a job is reused
    when it was built from the very same view, an equal spec and the same companions
    (a backend may reuse an unchanged job's view; the simulator's does)."""
    before = previous.elastic if previous is not None else {}
    active = {j.job_id: j for j in snapshot.jobs if j.state.is_active}
    elastic_specs: dict[int, ElasticSpec] = {}
    not_elastic: dict[int, str] = {}
    companions_of: dict[int, list[JobView]] = {}
    companion_parent_of: dict[int, int] = {}
    for job in active.values():
        parent_id = companion_parent(job.comment)
        if parent_id is not None:
            companion_parent_of[job.job_id] = parent_id
            companions_of.setdefault(parent_id, []).append(job)
            not_elastic[job.job_id] = f"companion of {parent_id}"
            continue
        reason, spec = _elastic_or_reason(job, resolve_spec, partition_allowed)
        if spec is None:
            not_elastic[job.job_id] = reason
        else:
            elastic_specs[job.job_id] = spec

    elastic: dict[int, ElasticJob] = {}
    orphans: list[tuple[JobView, str]] = []
    for job_id, spec in elastic_specs.items():
        parent = active[job_id]
        mine = companions_of.get(job_id)
        # Another user's job naming this parent is not ours to count (or to cancel).
        kept = (
            tuple(sorted((c for c in mine if c.user == parent.user), key=lambda c: c.job_id))
            if mine
            else ()
        )
        last = before.get(job_id)
        if (
            last is not None
            and last.job is parent
            and last.spec == spec
            and last.companions == kept
        ):
            elastic[job_id] = last  # immutable, and derived only from these three
        else:
            elastic[job_id] = ElasticJob(job=parent, spec=spec, companions=kept)
    for comp_id in sorted(companion_parent_of):
        why = orphan_reason(active[comp_id], active)
        if why is not None:
            orphans.append((active[comp_id], why))
    return Classification(
        elastic=elastic,
        companions=companion_parent_of,
        orphans=tuple(orphans),
        not_elastic=not_elastic,
        jobs=active,
    )


def _elastic_or_reason(
    job: JobView, resolve_spec: SpecResolver, partition_allowed: Callable[[str], bool]
) -> tuple[str, ElasticSpec | None]:
    why = untrusted(job.comment)
    if why is not None:
        return f"comment not trusted, job left alone: {why}", None
    try:
        spec = resolve_spec(job)
    except OutOfReach as exc:
        return f"out of reach: {exc}", None
    except MarkerError as exc:
        return f"malformed marker: {exc}", None
    if spec is None:
        return "not elastic", None
    if job.is_het:
        return "heterogeneous job (not resized)", None
    if not partition_allowed(job.partition):
        return f"partition {job.partition} not managed", None
    return "", spec
