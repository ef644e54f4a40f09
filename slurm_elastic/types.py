"""Plain dataclasses shared by every layer.

The layers talk to each other only through these types:

    slurm/ (observe)  -> ClusterSnapshot, JobView, NodeView, PartitionView, JobHistory
    model/ (estimate) -> Outlook (one per elastic job)
    policy/ (decide)  -> AllocationProblem -> Plan
    actuate/ (act)    -> Action

They are frozen and hold no behaviour beyond trivial derived properties, so that
decisions stay pure functions over values and the simulator can build the very
same objects the daemon builds from real Slurm.

Conventions
-----------
* Times are POSIX seconds (``float``); durations are seconds.
* Sizes are whole nodes.  (The simulator may model a "node" as one GPU slot.)
* ``None`` means "unknown / not applicable", never zero.
* Collections are tuples so that the dataclasses stay hashable and immutable.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field

# --------------------------------------------------------------------------- Slurm view


class JobState(enum.StrEnum):
    """Slurm base job states (``job_state`` in squeue JSON, ``state.current`` in sacct)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CONFIGURING = "CONFIGURING"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    RESIZING = "RESIZING"
    REVOKED = "REVOKED"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    UNKNOWN = "UNKNOWN"

    @property
    def is_active(self) -> bool:
        """Holds or may soon hold nodes."""
        return self in _ACTIVE_STATES

    @property
    def is_finished(self) -> bool:
        return not self.is_active and self is not JobState.UNKNOWN


_ACTIVE_STATES = frozenset(
    {
        JobState.PENDING,
        JobState.RUNNING,
        JobState.SUSPENDED,
        JobState.COMPLETING,
        JobState.CONFIGURING,
        JobState.REQUEUED,
        JobState.RESIZING,
    }
)


# A cluster has a handful of distinct partition lists, and every cycle asks for each job's.
@functools.lru_cache(maxsize=4096)
def partition_list(text: str) -> tuple[str, ...]:
    """``"a100, t4"`` -> ``("a100", "t4")``: a job's partition field as a list."""
    return tuple(p for p in (name.strip() for name in text.split(",")) if p)


@dataclass(frozen=True, slots=True)
class JobView:
    """One Slurm job as seen in one batched read of the queue.

    A heterogeneous job yields one JobView per component; ``job_id`` is the
    component's *raw* id (the one ``scontrol update JobId=`` accepts), and
    ``het_job_id``/``het_job_offset`` link the components.
    """

    job_id: int
    name: str
    user: str
    user_id: int | None
    account: str
    partition: str
    qos: str
    state: JobState
    state_reason: str
    node_count: int  # allocated nodes when running; requested minimum when pending
    min_nodes: int  # requested minimum (pending) / current size (running)
    max_nodes: int | None  # requested maximum, None when not given
    nodes: tuple[str, ...]  # expanded hostnames, empty while pending
    batch_host: str | None
    comment: str
    admin_comment: str = ""
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    resize_time: float | None = None
    time_limit_s: float | None = None  # None = unlimited
    restart_count: int = 0
    gpus_per_node: int = 0  # GRES gpu per node, 0 if none
    het_job_id: int | None = None
    het_job_offset: int | None = None
    work_dir: str = ""
    dependency: str = ""
    priority: float | None = None  # Slurm's priority (pending jobs start highest first)
    # A pending job's earliest start (its --begin time while Reason=BeginTime); None when
    # running, ended or unknown.
    eligible_time: float | None = None
    # Slurm runs the job's steps through its step manager (24.05+: the job flag
    # STEPMGR_ENABLED, set by --stepmgr or SlurmctldParameters=enable_stepmgr), which a
    # shrink leaves behind (actuate.guards.stepmgr_bars).
    stepmgr: bool = False

    @property
    def is_het(self) -> bool:
        return self.het_job_id is not None

    @property
    def partitions(self) -> tuple[str, ...]:
        """The partitions the job may run in, in its own order: a pending job submitted with
        ``-p a100,t4`` lists both ("a100,t4"), a running one the one it runs in."""
        return partition_list(self.partition)

    @property
    def is_running(self) -> bool:
        return self.state is JobState.RUNNING

    @property
    def is_pending(self) -> bool:
        return self.state is JobState.PENDING


_UNUSABLE_STATES = frozenset(("down", "drained", "drain", "fail", "failing", "future", "unknown"))
# NodeView.gpu_type (and a partition's, cluster_state.partition_gpu_types) when GPUs of more
# than one type (or typed beside untyped ones) are there: no single type can be claimed.
MIXED_GPU_TYPE = "mixed"
_UNUSABLE_FLAGS = frozenset(("DRAIN", "DRAINED", "FAIL"))


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as Slurm reports it: state, flags, CPUs and GPUs, partitions."""

    name: str
    state: str  # base state, lower case as sinfo reports it: idle, mixed, allocated, down, ...
    flags: tuple[str, ...]  # DRAIN, COMPLETING, ...
    cpus: int
    alloc_cpus: int
    gpus: int
    alloc_gpus: int
    partitions: tuple[str, ...]
    reason: str = ""
    # The type of the node's GPUs in its gres (``gpu:a100:4`` -> "a100"), lower case: the
    # same hardware reads the same however a site capitalises it.  "" when the GPUs are
    # untyped (``gpu:4``) or the node has none; MIXED_GPU_TYPE when it has several types
    # (``convert.gres_gpu_type`` says why not the most numerous one).
    gpu_type: str = ""

    @property
    def is_usable(self) -> bool:
        """Up and schedulable (not down, drained or failing)."""
        return self.state not in _UNUSABLE_STATES and _UNUSABLE_FLAGS.isdisjoint(self.flags)


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One partition as Slurm reports it: its nodes, limits and state."""

    name: str
    nodes: tuple[str, ...]  # expanded
    is_default: bool
    exclusive: bool  # OverSubscribe=EXCLUSIVE: every job gets whole nodes
    state: str  # UP, DOWN, DRAIN, INACTIVE
    max_time_s: float | None = None
    max_nodes: int | None = None  # MaxNodes: the most nodes one job may hold; None = unlimited
    qos: str = ""  # the partition's own QOS (QoS=), whose per-job limits bind its jobs; "" = none
    # Who may run jobs here (AllowGroups, AllowAccounts, AllowQos; None = ALL) and who may
    # not (DenyAccounts, DenyQos).  Slurm accepts a job listing a partition its user may
    # not use beside one it may (``-p batch,private``), and a job narrowed to such a
    # partition stays pending for good (docs/design.md): placement reads these.
    allow_groups: tuple[str, ...] | None = None
    allow_accounts: tuple[str, ...] | None = None
    allow_qos: tuple[str, ...] | None = None
    deny_accounts: tuple[str, ...] = ()
    deny_qos: tuple[str, ...] = ()

    @property
    def job_capacity(self) -> int:
        """The most nodes one job can ever hold here: its nodes, or fewer by MaxNodes."""
        n = len(self.nodes)
        return n if self.max_nodes is None else min(n, self.max_nodes)


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """Everything one observe step read, stamped with when it was read."""

    taken_at: float
    jobs: tuple[JobView, ...]
    nodes: tuple[NodeView, ...]
    partitions: tuple[PartitionView, ...]
    # How many Slurm calls this read cost: client processes (CLI backend, 3) or in-process
    # RPCs (pyslurm backend, 5); constant whatever the job count.
    slurm_calls: int = 0


@dataclass(frozen=True, slots=True)
class Allocation:
    """One period of a job at one size (from sacct's RESIZING records)."""

    start: float | None
    end: float | None
    node_count: int
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class JobHistory:
    """One logical job from accounting, its resize records collapsed into ``allocations``."""

    job_id: int
    name: str
    user: str
    account: str
    partition: str
    state: JobState
    submit_time: float | None
    start_time: float | None
    end_time: float | None
    comment: str
    allocations: tuple[Allocation, ...]  # oldest first; the last one is the current/final size
    work_dir: str = ""
    het_job_id: int | None = None
    het_job_offset: int | None = None

    @property
    def node_seconds(self) -> float:
        total = 0.0
        for a in self.allocations:
            if a.start is not None and a.end is not None:
                total += max(0.0, a.end - a.start) * a.node_count
        return total


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What the running Slurm can do, probed once at start-up."""

    version: str  # e.g. "22.05.8"
    json_plugin: str | None  # e.g. "openapi/v0.0.38", None when --json is unavailable
    permit_job_expansion: bool
    multiple_slurmd: bool = False
    # Slurm 22.05: a node freed by a shrink can stop taking exclusive jobs once the shrunk
    # job has ended, until ``scontrol reconfigure`` (see ``slurm.cli.leaks_nodes_after_shrink``).
    leaks_nodes_after_shrink: bool = False
    # What slurm.conf's PrivateData hides from users (lower-case words: "jobs", "users",
    # ...; empty for "none"), and who sees it all the same: SlurmUser and the users whose
    # AdminLevel is Operator or Administrator (``daemon.visibility``).
    private_data: tuple[str, ...] = ()
    slurm_user: str = ""
    admins: frozenset[str] = frozenset()


# --------------------------------------------------------------------------- elastic flag


@dataclass(frozen=True, slots=True)
class ElasticSpec:
    """A job's parsed elastic marker (see ``slurm_elastic.marker``)."""

    min_nodes: int
    max_nodes: int
    step: int = 1
    gpus_per_node: int | None = None
    resize_cost_s: float | None = None  # the user's estimate of one restart; measured later

    @property
    def allowed_sizes(self) -> tuple[int, ...]:
        """The grid the marker promises; what a job is offered now is
        ``cluster_state.offered_sizes``."""
        return tuple(range(self.min_nodes, self.max_nodes + 1, self.step))


# --------------------------------------------------------------------------- job reports


@dataclass(frozen=True, slots=True)
class ProgressReport:
    """What a running job's agent reports (authenticated; see daemon API).

    A report that came through the daemon's API carries ``claimed_nodes``: its ``time`` is
    then when the daemon received it and ``nodes`` the job's size in Slurm's view at that
    moment, not what the job said (docs/security.md, "What a report can claim").  The model
    measures such a job's speed from step deltas between arrivals at a size the job and
    Slurm agree on, and never takes ``samples_per_s`` or a size on the job's word.  The
    simulator's reports (the simulated cluster's own truth) leave ``claimed_nodes`` unset.
    """

    job_id: int
    time: float
    step: int
    nodes: int  # the job's size in nodes when the report was made (0: unknown)
    epoch: float | None = None
    loss: float | None = None  # or any metric; ``metric_higher_is_better`` says which way
    metric_higher_is_better: bool = False
    samples_per_s: float | None = None
    global_batch: int | None = None
    grad_noise_scale: float | None = None  # Pollux-style phi, optional
    target_metric: float | None = None  # user-given convergence target
    total_steps: int | None = None  # user-given budget, when known
    claimed_nodes: int | None = None  # the size the job said it ran at (API reports only)
    mode: str | None = None  # "torchft": resizes are stop-free (the job's claim)
    fallback: str | None = None  # protocol.Fallback: why it left the torchft mode


# --------------------------------------------------------------------------- estimate


@dataclass(frozen=True, slots=True)
class SizeEstimate:
    """Predicted behaviour of one job at one node count."""

    nodes: int
    throughput: float  # progress units (steps) per second at this size
    remaining_s: float  # predicted seconds to finish at this size (inf if unknown/never)


@dataclass(frozen=True, slots=True)
class Outlook:
    """Per elastic job: what each allowed size buys.  The policies consume this.

    ``remaining_work`` is in the same progress unit as ``SizeEstimate.throughput``
    (training steps at the job's global batch), so ``remaining_s = remaining_work /
    throughput`` for every size.
    """

    job_id: int
    current_nodes: int  # 0 when pending
    sizes: tuple[SizeEstimate, ...]  # one per allowed size, ascending by nodes
    remaining_work: float
    resize_cost_s: float  # seconds of lost progress per resize (restart overhead)
    confidence: float = 0.0  # 0 = pure prior, 1 = well fitted
    source: str = "prior"  # "prior" | "fitted" | "profile" | "user"

    def at(self, nodes: int) -> SizeEstimate | None:
        for s in self.sizes:
            if s.nodes == nodes:
                return s
        return None


# --------------------------------------------------------------------------- decide


@dataclass(frozen=True, slots=True)
class PlacementOption:
    """One partition a pending job may start in, and what it would buy there: a job
    submitted to several partitions whose GPUs differ (``-p a100,t4``) has one per
    partition, each with its own sizes and speeds (``ElasticDemand.options``)."""

    partition: str  # one partition of the job's own list
    allowed_sizes: tuple[int, ...]  # ascending, as ``ElasticDemand.allowed_sizes``
    outlook: Outlook


@dataclass(frozen=True, slots=True)
class ElasticDemand:
    """One elastic job as a policy sees it."""

    job_id: int
    partition: str
    current_nodes: int  # 0 when pending
    # The sizes offered this cycle (``cluster_state.offered_sizes``), ascending; min is
    # allowed_sizes[0].
    allowed_sizes: tuple[int, ...]
    outlook: Outlook
    weight: float = 1.0  # priority / fair-share weight
    submit_time: float = 0.0  # FIFO tie-break
    requested_nodes: int | None = None  # what the job asked for (static policy keeps it)
    frozen: bool = False  # guard rails say: keep current size this cycle
    # Slurm's priority: pending jobs start in descending priority, then submit order.
    priority: float = 0.0
    # Nodes the job holds by right; what it holds above them is on loan and is given back
    # when a pending job ahead of it in Slurm's order needs them (``policy.capacity``).
    # None: nothing it holds is on loan.
    entitled_nodes: int | None = None
    # Frozen only by dwell or cooldown: a reclaim may still take its loan.
    loan_yields: bool = False
    # A pending job that may start in several partitions of different speeds: one option
    # per partition, in the job's own order; the policy picks one (``Decision.partition``).
    # Empty: ``partition``, ``allowed_sizes`` and ``outlook`` are its one placement (every
    # running job: moving one between partitions is a requeue, never planned).
    options: tuple[PlacementOption, ...] = ()

    @property
    def min_nodes(self) -> int:
        return self.allowed_sizes[0]

    @property
    def max_nodes(self) -> int:
        return self.allowed_sizes[-1]

    @property
    def is_running(self) -> bool:
        return self.current_nodes > 0

    @property
    def loan(self) -> int:
        """Nodes held above the entitlement (0 when pending or not entitled)."""
        if self.entitled_nodes is None:
            return 0
        return max(0, self.current_nodes - self.entitled_nodes)

    @property
    def reclaim_floor(self) -> int:
        """The size a reclaim shrinks the job to at most: its entitlement, or its current
        size when its loan cannot be taken this cycle (frozen by an action in flight)."""
        if self.frozen and not self.loan_yields:
            return self.current_nodes
        return self.current_nodes - self.loan

    @property
    def reclaim_grid_floor(self) -> int:
        """The size a reclaim actually leaves the job at: its ``reclaim_floor`` when that is
        an allowed size, else the allowed size just below it (the grid forces the shrink
        past the entitlement, and the node that frees is as free as the loan), or its
        current size when nothing is reclaimable."""
        if self.reclaim_floor >= self.current_nodes:
            return self.current_nodes
        return max((s for s in self.allowed_sizes if s <= self.reclaim_floor), default=0)

    def candidate_sizes(self, reclaiming: bool = False) -> list[int]:
        """The sizes a policy chooses among, ascending: the current size alone when frozen
        (and, with ``reclaiming``, the allowed sizes down to its ``reclaim_floor``);
        when running, the allowed sizes with the current one (a problem built by the
        daemon has it already); when pending, 0 (stay pending) and the allowed sizes."""
        if self.frozen:
            if not reclaiming or self.reclaim_floor >= self.current_nodes:
                return [self.current_nodes]
            # Down to the entitlement, or to the grid size just below it when it is off
            # the grid.
            lowest = self.reclaim_grid_floor
            return [s for s in self.allowed_sizes if lowest <= s < self.current_nodes] + [
                self.current_nodes
            ]
        if self.is_running:
            if self.current_nodes in self.allowed_sizes:  # on the grid (ascending, distinct)
                return list(self.allowed_sizes)
            return sorted(set(self.allowed_sizes) | {self.current_nodes})
        return [0, *self.allowed_sizes]


@dataclass(frozen=True, slots=True)
class RigidDemand:
    """A job the daemon never resizes: it holds (running) or wants (pending) ``nodes``."""

    job_id: int
    partition: str
    nodes: int
    running: bool
    submit_time: float = 0.0  # FIFO position of a pending rigid job (policy reservations)
    priority: float = 0.0  # Slurm's priority: its place in line comes first from this
    # False: pending but not startable yet, with a start promised soon (a --begin time):
    # running elastic jobs do not grow into its nodes, nothing is reclaimed for it.
    startable: bool = True


@dataclass(frozen=True, slots=True)
class NodePool:
    """A set of interchangeable usable nodes that belong to exactly the same partitions."""

    partitions: frozenset[str]
    nodes: int


@dataclass(frozen=True, slots=True)
class AllocationProblem:
    """Input of ``policy.allocate``.  Pure data: the same from the daemon and the simulator."""

    now: float
    elastic: tuple[ElasticDemand, ...]
    rigid: tuple[RigidDemand, ...]
    pools: tuple[NodePool, ...]
    horizon_s: float = 3600.0  # look-ahead for gains and resize payback
    time_limit_s: float = 1.0  # solver wall-clock budget


class SolverStatus(enum.StrEnum):
    """How a plan was reached (``Plan.status``): optimal, feasible, fallback, no change."""

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"  # time limit hit with an incumbent
    FALLBACK = "fallback"  # another policy produced the plan
    NO_CHANGE = "no_change"  # everything failed: keep current sizes


@dataclass(frozen=True, slots=True)
class CandidateFigures:
    """One size a policy weighed for a job, with the numbers it weighed there."""

    nodes: int  # 0: stay pending
    steps_per_s: float  # the job's predicted rate at this size (its Outlook)
    predicted_gain: float  # progress over the horizon vs the current size
    resize_cost: float  # progress lost to the resize (0 at the current size, or pending)


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a job gets its size: predicted gain, resize cost, the deciding rule."""

    predicted_gain: float  # progress (steps) gained over the horizon vs the current size
    resize_cost: float  # progress lost to the resize
    rule: str  # stable short name: "marginal-gain", "capacity", "min", "max", "payback", ...
    detail: str = ""
    waiting_job: int | None = None  # rule "reclaim": the pending job the loan goes back to


@dataclass(frozen=True, slots=True)
class WeighedSizes:
    """Every size a policy weighed for every job of a plan, flat (``Plan.weighed``): the
    ``i``-th decision's sizes are ``start[i]:start[i + 1]``, ascending.  Built once per plan
    with array operations; read per job (:meth:`of`) only where someone looks."""

    start: tuple[int, ...]
    nodes: tuple[int, ...]
    steps_per_s: tuple[float, ...]
    predicted_gain: tuple[float, ...]
    resize_cost: tuple[float, ...]

    def of(self, index: int) -> tuple[CandidateFigures, ...]:
        """The sizes weighed for the ``index``-th decision."""
        a, b = self.start[index], self.start[index + 1]
        return tuple(
            CandidateFigures(n, r, g, c)
            for n, r, g, c in zip(
                self.nodes[a:b],
                self.steps_per_s[a:b],
                self.predicted_gain[a:b],
                self.resize_cost[a:b],
                strict=True,
            )
        )


@dataclass(frozen=True, slots=True)
class Decision:
    """One job's planned size, with its explanation."""

    job_id: int
    current_nodes: int
    target_nodes: int  # 0 = stay pending (no room yet)
    explanation: Explanation
    # The partition to start in, for a demand with placement options; None otherwise.
    partition: str | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    """A size for every elastic job, from one policy run, with how it was reached."""

    decisions: tuple[Decision, ...]
    solver: str  # "mip", "greedy", "dp", "static"
    status: SolverStatus
    objective: float
    gap: float = 0.0
    solve_s: float = 0.0
    note: str = ""  # e.g. why a fallback happened
    weighed: WeighedSizes | None = None  # every job's candidate sizes, in decision order

    def target(self, job_id: int) -> int | None:
        for d in self.decisions:
            if d.job_id == job_id:
                return d.target_nodes
        return None

    def targets(self) -> dict[int, int]:
        """Every job's target (the first decision per job, as ``target``): for callers
        that look up many jobs, where a scan per job would be quadratic."""
        found: dict[int, int] = {}
        for d in self.decisions:
            found.setdefault(d.job_id, d.target_nodes)
        return found


# --------------------------------------------------------------------------- act


class ActionKind(enum.StrEnum):
    """What the daemon does to a job (the journal's ``kind`` and the status JSON's)."""

    START_AT_SIZE = "start_at_size"  # pin a pending job: NumNodes=n-n
    SHRINK = "shrink"  # instruct, await ack, NumNodes=n
    GROW = "grow"  # submit a companion job
    CANCEL_COMPANION = "cancel_companion"  # orphan or no longer wanted
    RECONFIGURE = "reconfigure"  # scontrol reconfigure after a shrunk job ended (Slurm quirk)


class ActionOutcome(enum.StrEnum):
    """What became of one proposed action in a cycle: the status JSON's ``outcome`` and the
    ``action.<outcome>`` log event.  The first six are also journal statuses."""

    APPLIED = "applied"
    WAITING = "waiting"  # a shrink awaiting its job's checkpoint acknowledgement
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    # Slurm refused a shrink or a start-at-size of a job still in the state it needs (the
    # detail is Slurm's message): a fact about that job, not asked again until the job
    # changes or ``guards.refusal_hold_s`` has passed.
    REFUSED = "refused"
    # Slurm said "not now" (a temporary refusal) or could not be reached: nothing changed,
    # and the action is asked again after a backoff (``actuate.guards.retry_bars``).
    RETRY = "retry"
    BLOCKED = "blocked"  # a guard said no (the detail says which)
    DEFERRED = "deferred"  # over max_resizes_per_cycle: proposed again next cycle
    SHADOW = "shadow"  # shadow mode: computed, not applied


class CycleErrorKind(enum.StrEnum):
    """Why a control cycle failed: the head of ``CycleResult.error`` (``"<kind>: <detail>"``)
    and the ``kind`` label of the ``slurm_elastic_errors`` metric."""

    OBSERVE = "observe"  # reading the cluster failed
    STALE_SNAPSHOT = "stale snapshot"  # the snapshot is older than guards.stale_snapshot_s
    CYCLE = "cycle"  # deciding or acting failed (a SlurmElasticError)


@dataclass(frozen=True, slots=True)
class Action:
    """One change the daemon proposes to make to one job in Slurm."""

    kind: ActionKind
    job_id: int
    from_nodes: int
    to_nodes: int
    reason: str = ""
    extra: tuple[tuple[str, str], ...] = field(default=())
