"""Security class 5 of issue 19: one user's invented reports must not take nodes from another.

What the daemon can see for itself it never takes from a report: the size a report is
recorded at is Slurm's, its time is when it arrived, and a rate is measured from step
deltas between arrivals (docs/security.md, "What a report can claim").  The decision tests
run the daemon's own Controller and policy over hand-written snapshots; the live test runs
the daemon against the local cluster with two unprivileged users.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_elastic import protocol
from slurm_elastic.actuate.instructions import InstructionBoard
from slurm_elastic.actuate.journal import Journal
from slurm_elastic.cluster_state import ElasticJob
from slurm_elastic.config import Config
from slurm_elastic.daemon.api import parse_report
from slurm_elastic.daemon.controller import Controller
from slurm_elastic.daemon.estimate import Estimator
from slurm_elastic.daemon.reports import ReportStore
from slurm_elastic.errors import ReportRejected
from slurm_elastic.model.outlook import GrowCheck, JobModel
from slurm_elastic.types import ActionKind, ElasticSpec
from tests.fakes import RecordingBackend
from tests.slurm_cluster import ClusterUser, SlurmCluster, wait_until
from tests.test_daemon_controller_data import job, snapshot
from tests.test_daemon_service_process import daemon_process, read_events, wait_api, write_config

LIAR, HONEST, FILLER = 20, 21, 22


def test_report_is_recorded_at_slurms_size_and_arrival_time() -> None:
    body = {"step": 500, "nodes": 3, "time": 5.0, "samples_per_s": 10_000.0}
    report = parse_report(LIAR, body, received_at=1234.5, slurm_nodes=1)
    assert (report.nodes, report.claimed_nodes, report.time) == (1, 3, 1234.5)
    # A job Slurm does not show running (elastic) has no size the daemon vouches for.
    assert parse_report(LIAR, body, received_at=1.0, slurm_nodes=None).nodes == 0


def test_a_claimed_mode_is_one_of_two_words_and_prices_only_the_claimant() -> None:
    """``mode`` is the job's word on how it resizes: ``torchft`` or ``torchrun``, anything
    else is a 400; what it claims changes the default price of its own resizes only
    (test_daemon_estimate.py: ..._priced_by_its_own_default_until_measured)."""
    body = {"step": 5, "nodes": 1, "mode": "torchft"}
    assert parse_report(LIAR, body, received_at=1.0, slurm_nodes=1).mode == "torchft"
    for bad in ("free", "", "TORCHFT", 1):
        with pytest.raises(ReportRejected, match="mode"):
            parse_report(LIAR, {**body, "mode": bad}, received_at=1.0, slurm_nodes=1)


def _bodies(claims: list[tuple[int, int]], every_s: float = 5.0) -> list[dict]:
    """Report bodies, one per ``every_s``: per entry (claimed nodes, steps made since the
    previous report), with the rate those claims imply."""
    out, step = [], 0
    for claimed, made in claims:
        step += made
        out.append(
            {"step": step, "nodes": claimed, "samples_per_s": made / every_s, "global_batch": 1}
        )
    return out


def test_a_claimed_size_or_rate_is_not_a_measurement() -> None:
    """A job on 1 node claiming 10,000 samples/s at 2 and 3 nodes: no rate at 2 or 3."""
    model = JobModel(LIAR)
    bodies = [
        {"step": 100 * i, "nodes": 2 + i % 2, "samples_per_s": 10_000.0, "global_batch": 1}
        for i in range(1, 9)
    ]
    for i, body in enumerate(bodies):
        model.update(parse_report(LIAR, body, received_at=1000.0 + 5 * i, slurm_nodes=1))
    assert model.throughput_points() == ()  # every report disputed its size: no rate at all
    honest = [{"step": 100 * i, "nodes": 1, "samples_per_s": 10_000.0} for i in range(1, 5)]
    for i, body in enumerate(honest):
        model.update(parse_report(LIAR, body, received_at=2000.0 + 5 * i, slurm_nodes=1))
    # Measured at its own size from arrivals (100 steps per 5 s), never the claimed rate.
    ((size, rate),) = model.throughput_points()
    assert size == 1 and rate == pytest.approx(20.0)


# --------------------------------------------------------------------------- decisions


def _cluster() -> list:
    """bob's elastic job on n1 (1-3 nodes), alice's on n2-n3 (1-2), a rigid job on n4: a
    full cluster, so a node for bob can only come from alice."""
    return [
        job(LIAR, nodes=("n1",), hi=3, user="bob"),
        job(HONEST, nodes=("n2", "n3"), hi=2, user="alice"),
        job(FILLER, nodes=("n4",), comment=""),
    ]


def _controller() -> tuple[Controller, RecordingBackend, InstructionBoard]:
    backend = RecordingBackend(snapshot(_cluster()), fresh=True)
    config = Config.model_validate(
        {"mode": "enforce", "guards": {"min_dwell_s": 0, "cooldown_s": 0}}
    )
    board = InstructionBoard()
    ctl = Controller(
        backend,  # type: ignore[arg-type]
        config,
        reports=ReportStore(),
        journal=Journal(),
        agents=board,
    )
    return ctl, backend, board


LIAR_CLAIMS = [(1, 5), (2, 50_000), (3, 50_000)] * 6  # 1 step/s on 1 node, "10,000/s" on 2, 3
HONEST_CLAIMS = [(2, 500)] * 18  # 100 steps/s on its 2 nodes


def _run(as_the_api_records: bool) -> tuple[Controller, RecordingBackend, InstructionBoard]:
    """A cycle every 15 s while both jobs report every 5 s, for 90 s."""
    ctl, backend, board = _controller()
    now = 1000.0
    ctl.run_once(now)  # the first cycle: Slurm's sizes are known from here on
    pairs = zip(_bodies(LIAR_CLAIMS), _bodies(HONEST_CLAIMS), strict=True)
    for i, (lie, truth) in enumerate(pairs):
        now += 5.0
        for job_id, body in ((LIAR, lie), (HONEST, truth)):
            report = parse_report(
                job_id,
                body,
                received_at=now + 0.1 * (job_id - LIAR),
                slurm_nodes=ctl.size_of(job_id),
            )
            if not as_the_api_records:
                # What the daemon did before issue 19: size and rate as the job said.
                report = replace(report, nodes=body["nodes"], claimed_nodes=None)
            ctl.reports.add(report)
        if i % 3 == 2:
            ctl.run_once(now + 1.0)
    return ctl, backend, board


def test_invented_rates_at_other_sizes_take_no_node_from_another_users_job() -> None:
    ctl, backend, board = _run(as_the_api_records=True)
    assert ctl.journal.actions_for(HONEST) == () and board.pending_for(HONEST) is None
    assert ctl.journal.actions_for(LIAR) == () and backend.actions() == []
    assert ctl.size_of(HONEST) == 2


def test_the_same_lies_taken_at_their_word_would_take_the_node() -> None:
    """The scenario above is one where the lie matters: recorded as the job said (the
    daemon before issue 19), the honest job is told to shrink for the liar."""
    ctl, _, board = _run(as_the_api_records=False)
    instruction = board.pending_for(HONEST)
    assert instruction is not None and instruction.target_nodes == 1
    assert {e.kind for e in ctl.journal.actions_for(HONEST)} == {ActionKind.SHRINK}
    assert {e.kind for e in ctl.journal.actions_for(LIAR)} == {ActionKind.GROW}


# --------------------------------------------------------------------------- grow check


def _at(model: JobModel, size: int, start: float, step0: int, rate: float, n: int = 5) -> int:
    """``n`` reports 5 s apart at ``size`` (Slurm's and claimed) making ``rate`` steps/s."""
    step = step0
    for i in range(n):
        step += int(rate * 5)
        body = {"step": step, "nodes": size}
        model.update(parse_report(model.job_id, body, received_at=start + 5 * i, slurm_nodes=size))
    return step


def test_a_grow_whose_promised_gain_does_not_appear_stops_buying_nodes() -> None:
    model = JobModel(30, check=GrowCheck(reports=3, min_gain_share=0.5))
    step = _at(model, 2, 1000.0, 0, 100.0)
    before = model.fit()
    assert before.throughput is not None
    promised = before.throughput.throughput(3) / before.throughput.throughput(2)
    assert promised > 1.2  # the prior's shape: a third node helps
    model.record_resize(1030.0, 3)
    _at(model, 3, 1040.0, step, 101.0)  # the third node made it 1% faster
    assert model.overpromised
    fit = model.fit().throughput
    assert fit is not None and fit.flat_beyond
    best = max(fit.throughput(2), fit.throughput(3))
    # No gain is extrapolated beyond what it has run at; measured sizes are kept as measured.
    assert max(fit.throughput(n) for n in (4, 6, 8)) <= best
    assert fit.throughput(3) == pytest.approx(101.0, rel=0.05)


def test_a_grow_that_delivers_keeps_its_extrapolation() -> None:
    model = JobModel(31, check=GrowCheck(reports=3, min_gain_share=0.5))
    step = _at(model, 2, 1000.0, 0, 100.0)
    fit = model.fit().throughput
    assert fit is not None
    promised = fit.throughput(3) / fit.throughput(2)
    model.record_resize(1030.0, 3)
    _at(model, 3, 1040.0, step, 100.0 * promised)
    assert not model.overpromised
    after = model.fit().throughput
    assert after is not None and not after.flat_beyond and after.throughput(4) > after.throughput(3)


def test_no_job_looks_better_than_one_that_scales_perfectly() -> None:
    """Grown from 1 to 2 nodes, a job claims (by its step counts) a 100x speed-up: the fit
    keeps at most a linear one, there and beyond."""
    model = JobModel(33)
    step = _at(model, 1, 1000.0, 0, 10.0)
    model.fit()
    model.record_resize(1030.0, 2)
    _at(model, 2, 1040.0, step, 1000.0)
    fit = model.fit().throughput
    assert fit is not None
    assert fit.throughput(2) <= 2.0 * fit.throughput(1) * 1.001
    assert fit.throughput(4) <= 2.0 * fit.throughput(2) * 1.001


def test_the_grow_check_can_be_turned_off() -> None:
    model = JobModel(32, check=GrowCheck(reports=3, min_gain_share=0.0))
    step = _at(model, 2, 1000.0, 0, 100.0)
    model.fit()
    model.record_resize(1030.0, 3)
    _at(model, 3, 1040.0, step, 100.0)
    assert not model.overpromised


# --------------------------------------------------------------------------- bounds


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("step", 10**400),
        ("step", protocol.MAX_STEP + 1),
        ("total_steps", 10**20),
        ("nodes", 10**9),
        ("loss", 1e308),
        ("loss", math.inf),
        ("loss", math.nan),
        ("samples_per_s", math.inf),
        ("target_metric", -1e308),
        ("epoch", math.nan),
        ("grad_noise_scale", -1.0),
        ("global_batch", 10**12),
        ("time", math.inf),
    ],
)
def test_every_number_is_bounded_and_finite(field: str, value: float) -> None:
    body = {"step": 1, "nodes": 1, field: value}
    with pytest.raises(ReportRejected, match=field):
        parse_report(LIAR, body, received_at=1.0, slurm_nodes=1)


@pytest.mark.parametrize(
    "value",
    ["OUTSIDE_KILLS", "outside_kills\nREADY=1", "\x1b[2J", "x" * 100_000, 1, ["outside_kills"]],
)
def test_a_fallback_is_only_a_word_from_the_daemons_list(value: object) -> None:
    """The one report field shown to admins as text (status REASON, explain): a job's
    own lie about it is one of the daemon's words or a 400, never text of the job's."""
    with pytest.raises(ReportRejected, match="fallback"):
        parse_report(
            LIAR, {"step": 1, "nodes": 1, "fallback": value}, received_at=1.0, slurm_nodes=1
        )


def _bounded(low: float, high: float) -> st.SearchStrategy[float]:
    """Any finite value in range, its bounds and the smallest magnitudes included."""
    edges = [v for v in (low, high, 0.0, 1e-300, -1e-300) if low <= v <= high]
    return st.one_of(st.sampled_from(edges), st.floats(low, high, allow_nan=False))


_VALID = st.fixed_dictionaries(
    {"step": st.one_of(st.sampled_from([0, protocol.MAX_STEP]), st.integers(0, protocol.MAX_STEP))},
    optional={
        "nodes": st.integers(1, protocol.MAX_NODES),
        "epoch": _bounded(0, protocol.MAX_EPOCH),
        "loss": _bounded(-protocol.MAX_VALUE, protocol.MAX_VALUE),
        "metric_higher_is_better": st.booleans(),
        "samples_per_s": _bounded(0, protocol.MAX_VALUE),
        "global_batch": st.sampled_from([1, protocol.MAX_BATCH])
        | st.integers(1, protocol.MAX_BATCH),
        "grad_noise_scale": _bounded(0, protocol.MAX_VALUE),
        "target_metric": _bounded(-protocol.MAX_VALUE, protocol.MAX_VALUE),
        "total_steps": st.sampled_from([1, protocol.MAX_STEP]) | st.integers(1, protocol.MAX_STEP),
        "mode": st.sampled_from(["torchrun", "torchft"]),
    },
)


def _outlook_is_sane(estimator: Estimator, ej: ElasticJob, now: float) -> None:
    outlook = estimator.outlooks({ej.job.job_id: ej}, now).get(ej.job.job_id)
    assert outlook is not None, "the job lost its outlook"
    assert math.isfinite(outlook.remaining_work) and outlook.remaining_work > 0
    for est in outlook.sizes:
        assert math.isfinite(est.throughput) and est.throughput > 0
        assert math.isfinite(est.remaining_s) and est.remaining_s > 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile=_VALID, where=st.integers(0, 4))
def test_no_valid_report_breaks_the_jobs_model(hostile: dict, where: int) -> None:
    """One report that passes validation, anywhere among honest ones: every later cycle
    still gives the job a finite outlook, and later reports still count."""
    hostile = {"nodes": 2, **hostile}
    ej = ElasticJob(job=job(40, nodes=("n1", "n2"), hi=4), spec=ElasticSpec(1, 4))
    estimator = Estimator(ReportStore(), 30.0)
    now = 1000.0
    for i in range(8):
        now += 5.0
        body = hostile if i == where else {"step": 100 * (i + 1), "nodes": 2, "loss": 1.0 / (i + 1)}
        estimator.reports.add(parse_report(40, body, received_at=now, slurm_nodes=2))
        _outlook_is_sane(estimator, ej, now + 1.0)
    assert estimator.bank.model(40).fit().n_reports == 8
    # What `explain` shows as measured (jobs[].measured): at Slurm's size only, whatever
    # the report claimed, finite, and in this job's rows alone.
    rates = estimator.measured_rates(40)
    assert rates and all(n == 2 and math.isfinite(r) and r > 0 for n, r in rates), rates
    assert estimator.measured_rates(41) == ()


# --------------------------------------------------------------------------- live


def _running_nodes(cluster: SlurmCluster, job_id: int) -> int | None:
    out = cluster.run("squeue", "-h", "-j", str(job_id), "-t", "R", "-o", "%D", check=False)
    text = out.stdout.strip()
    return int(text) if text.isdigit() else None


def _post_as(user: ClusterUser, url: str, body: dict) -> int:
    """POST ``body`` with ``user``'s own MUNGE credential (made as that user)."""
    data = json.dumps(body).encode()
    cred = user.run("munge", "-s", protocol.body_digest(data)).stdout.strip()
    request = urllib.request.Request(url, data=data, method="POST", headers={protocol.HEADER: cred})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _fresh_dir(user: ClusterUser, name: str) -> Path:
    """A working directory of ``user``'s own that no earlier job of theirs ran in."""
    path = user.home / name
    user.run("mkdir", "-p", str(path))
    return path


@pytest.mark.slurm
def test_live_invented_rates_take_no_node_from_another_user(
    clean_queue: SlurmCluster, two_users: tuple[ClusterUser, ClusterUser], tmp_path: Path
) -> None:
    """The review's attack on a full 4-node cluster: bob's elastic job runs on 1 node and
    reports, with bob's own credential, 10,000 samples/s "at 2 and 3 nodes"; alice's elastic
    job runs on 2 and reports honestly; a rigid job holds the 4th.  The daemon (enforce
    mode, no dwell, no cooldown) must neither tell alice's job to shrink nor grow bob's.

    Until a job's second report measures its rate, its step budget is a share of a typical
    run from its owner's history (``model.priors``: same name, else same working directory).
    Each job here gets a name and a working directory of its own, so neither user's earlier
    jobs (every other test's, run from their homes) value the two unequally."""
    alice, bob = two_users
    run = uuid.uuid4().hex[:8]
    alice_dir, bob_dir = (_fresh_dir(user, f"invented-{run}") for user in (alice, bob))
    sleep = ("-p", "batch", "-t", "5", "--wrap", "sleep 300")
    honest = alice.sbatch(
        "-N1-2", "--comment=elastic:min=1,max=2", "-J", f"honest-{run}", *sleep, cwd=alice_dir
    )
    wait_until(lambda: _running_nodes(clean_queue, honest) == 2, 30, "alice's job on 2 nodes")
    filler = alice.sbatch("-N1", "-J", f"filler-{run}", *sleep, cwd=alice_dir)
    wait_until(lambda: _running_nodes(clean_queue, filler) == 1, 30, "the rigid job")
    liar = bob.sbatch(
        "-N1-3", "--comment=elastic:min=1,max=3", "-J", f"liar-{run}", *sleep, cwd=bob_dir
    )
    wait_until(lambda: _running_nodes(clean_queue, liar) == 1, 30, "bob's job on the last node")

    config = write_config(
        tmp_path / "slurm-elastic.yaml",
        tmp_path / "state",
        extra="mode: enforce\nguards: {min_dwell_s: 0, cooldown_s: 0}\n",
    )
    log_path = tmp_path / "daemon.log"
    with daemon_process(config, log_path):
        status_path = tmp_path / "state" / "status.json"
        url = wait_api(log_path, status_path, liar)
        rows = {r["job_id"]: r for r in json.loads(status_path.read_text())["jobs"]}
        ranges = {j: (rows[j]["min"], rows[j]["max"]) for j in (honest, liar)}
        assert ranges == {honest: (1, 2), liar: (1, 3)}  # both resizable
        liar_step = honest_step = 0
        for i in range(24):  # 12 s of reports, two daemon cycles per round
            claimed = (1, 2, 3)[i % 3]
            liar_step += 1 if claimed == 1 else 5_000  # 2/s on 1 node, "10,000/s" at 2 and 3
            honest_step += 50  # 100 steps/s
            # Both runs are long (a step budget, so no earlier run's history decides).
            lie = {"step": liar_step, "nodes": claimed, "global_batch": 1, "total_steps": 10**12,
                   "samples_per_s": 1.0 if claimed == 1 else 10_000.0}  # fmt: skip
            truth = {"step": honest_step, "nodes": 2, "global_batch": 1, "total_steps": 10**9,
                     "samples_per_s": 100.0}  # fmt: skip
            assert _post_as(bob, f"{url}/v1/jobs/{liar}/report", lie) == 200
            assert _post_as(alice, f"{url}/v1/jobs/{honest}/report", truth) == 200
            with urllib.request.urlopen(f"{url}/v1/jobs/{honest}/instruction") as response:
                assert json.loads(response.read()) == {"instruction": None}
            time.sleep(0.5)
        events = read_events(log_path)
    acted = [e for e in events if e.get("job_id") in (honest, liar) and e["event"] in ACTED]
    assert acted == []
    assert _running_nodes(clean_queue, honest) == 2
    assert sorted(clean_queue.active_job_ids()) == sorted([honest, filler, liar])  # no companion
    cycles = [e for e in events if e["event"] == "cycle.done"]
    assert len(cycles) >= 10


ACTED = {"shrink.instructed", "action.applied", "action.waiting", "journal.intent"}
