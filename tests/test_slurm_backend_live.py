"""Every backend read and action against the real local cluster, for both backends.

Each test runs twice: with the CLI backend and with the pyslurm backend (pyslurm built for
the running Slurm; skipped where there is none, a failure in CI: ``tests/slurm_cluster.py``).
``test_backends_give_equal_views`` reads one cluster state through both.

Run against instance 2 while several engineers share the machine:
``SLURM_ELASTIC_TEST_INSTANCE=2 pytest -m slurm tests/test_slurm_backend_live.py``.
Jobs are tiny (``sleep``); ``clean_queue`` leaves an empty queue and idle nodes.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from slurm_elastic.errors import ActionRefused, ConfigError, SlurmRejected, SlurmUnreachable
from slurm_elastic.slurm.backend import SlurmBackend
from slurm_elastic.slurm.cli import CliBackend
from slurm_elastic.slurm.parse_text import parse_scontrol_jobs
from slurm_elastic.slurm.pyslurm_backend import PyslurmBackend
from slurm_elastic.slurm.select import make_backend
from slurm_elastic.types import ClusterSnapshot, JobState, JobView
from tests.slurm_cluster import ClusterUser, SlurmCluster, site_settings, wait_until

pytestmark = pytest.mark.slurm

SLEEP = "#!/bin/bash\nsleep 300\n"
BACKENDS = ("cli", "pyslurm")
# Calls per read_cluster: client processes (CLI) or RPCs (pyslurm's module doc; pyslurm
# 24.11 reads partitions with Partitions.load(), one RPC more).
READ_CALLS = {"cli": 3, "pyslurm": 5}
PYSLURM_24_READ_CALLS = 6


def read_calls(backend: CliBackend, version: str) -> int:
    kind = kind_of(backend)
    return PYSLURM_24_READ_CALLS if kind == "pyslurm" and version != "22.05" else READ_CALLS[kind]


Factory = Callable[..., CliBackend]


def sbatch(cluster: SlurmCluster, *args: str, script: str = SLEEP) -> int:
    out = cluster.run(
        "sbatch", "--parsable", "-o", "/dev/null", *args, "--wrap", script.split("\n", 1)[1]
    )
    return int(out.stdout.strip().split(";")[0])


def job(backend: CliBackend, job_id: int) -> JobView:
    view = backend.read_job(job_id)
    assert view is not None, f"job {job_id} vanished"
    return view


def wait_state(backend: CliBackend, job_id: int, state: JobState, timeout: float = 30) -> JobView:
    wait_until(lambda: job(backend, job_id).state is state, timeout, f"job {job_id} {state}")
    return job(backend, job_id)


def idle_nodes(cluster: SlurmCluster) -> set[str]:
    return {n for n, s in cluster.node_states().items() if s == "idle"}


def kind_of(backend: CliBackend) -> str:
    return "pyslurm" if isinstance(backend, PyslurmBackend) else "cli"


def actions_sent(backend: CliBackend) -> int:
    """State-changing requests that reached Slurm: commands run, plus pyslurm's RPCs."""
    return backend.runner.action_calls + getattr(backend, "rpc_action_calls", 0)


@pytest.fixture(params=BACKENDS)
def new_backend(request: pytest.FixtureRequest, slurm_cluster: SlurmCluster) -> Factory:
    """Builds backends of this test's kind: ``new_backend(slurm_conf=..., **options)``."""
    if request.param == "cli":
        return CliBackend
    module = request.getfixturevalue("pyslurm_module")

    def build(**options: Any) -> CliBackend:
        return PyslurmBackend(module, **options)

    build.pyslurm_module = module  # type: ignore[attr-defined]
    return build


@pytest.fixture
def backend(new_backend: Factory, clean_queue: SlurmCluster) -> CliBackend:
    return new_backend(slurm_conf=str(clean_queue.conf), timeout_s=20)


@pytest.fixture
def heal_after_shrink(clean_queue: SlurmCluster) -> Iterator[None]:
    """Slurm 22.05 quirk (docs/admin-guide.md, "Slurm versions and known Slurm bugs"): once
    a shrunk job has ended, a later job that starts on the freed nodes can leave one of them
    unschedulable ("Requested nodes are busy") although sinfo says idle; `scontrol
    reconfigure` after the shrunk job ended prevents it.  Keep the shared test cluster
    healthy for the next test.
    (Through the CLI backend whatever the backend under test: it is housekeeping.)"""
    yield
    backend = CliBackend(slurm_conf=str(clean_queue.conf), timeout_s=20)
    for view in backend.read_jobs():
        if view.state.is_active:
            backend.cancel(view.job_id)
    wait_until(
        lambda: not any(v.state.is_active for v in backend.read_jobs()), 20, "an empty queue"
    )
    clean_queue.run("scontrol", "reconfigure")


@pytest.fixture
def shared_dir_tmp() -> Iterator[Path]:
    """A world-writable directory: jobs of other users write here (pytest's tmp_path has
    root-only parents)."""
    path = Path(tempfile.mkdtemp(prefix="slurm-elastic-backend-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- reads


def test_read_cluster_costs_the_same_whatever_the_job_count(
    backend: CliBackend, clean_queue: SlurmCluster
) -> None:
    assert isinstance(backend, SlurmBackend)
    first = backend.read_cluster(now=123.0)
    ids = [sbatch(clean_queue, "-N1", "-p", "shared", "--hold") for _ in range(5)]
    second = backend.read_cluster()
    assert first.slurm_calls == second.slurm_calls == read_calls(backend, clean_queue.version)
    assert first.taken_at == 123.0
    assert {j.job_id for j in second.jobs} >= set(ids)
    assert all(j.state is JobState.PENDING for j in second.jobs if j.job_id in ids)
    assert [n.name for n in second.nodes] == list(clean_queue.nodes)
    assert {p.name for p in second.partitions} == {"batch", "shared"}
    # The squeue -o text fast path sees the same jobs in the same states.
    text = CliBackend(slurm_conf=str(clean_queue.conf), job_format="text").read_jobs()
    assert {(j.job_id, j.state) for j in text} == {(j.job_id, j.state) for j in second.jobs}


def test_partitions_read_while_a_job_cannot_be_scheduled(
    backend: CliBackend, clean_queue: SlurmCluster
) -> None:
    """From 24.11 Slurm sets a partition flag above 16 bits (PART_FLAG_SCHED_FAILED) when a
    scheduling pass cannot start one of its jobs, and pyslurm 24.11's deprecated
    partition().get() then raises OverflowError (docs/slurm-versions.md, "pyslurm").  The
    read must keep working through such a pass and give scontrol's partitions."""
    cli = CliBackend(slurm_conf=str(clean_queue.conf), timeout_s=20)
    clean_queue.run("scontrol", "update", "NodeName=n4", "State=DRAIN", "Reason=test")
    try:
        sbatch(clean_queue, "-N4", "-J", "pend4")  # cannot start beside the drained node
        deadline = time.monotonic() + 6  # spans at least one scheduling pass (bf_interval=5)
        while time.monotonic() < deadline:
            assert backend.read_partitions() == cli.read_partitions()
            time.sleep(0.5)
    finally:
        clean_queue.run("scontrol", "update", "NodeName=n4", "State=RESUME")


def test_partition_access_lists_read_as_scontrol_shows_them(
    backend: CliBackend, clean_queue: SlurmCluster
) -> None:
    """Who may use a partition (issue 17), through both backends: pyslurm 24.11 reads an
    unset Deny list as ["ALL"], pyslurm 22.5 drops a DenyQos (that read then goes through
    scontrol); the views equal scontrol's either way.  `scontrol reconfigure` puts
    slurm.conf's lists back (clearing a Deny list by update leaves "" on 24.11)."""
    cli = CliBackend(slurm_conf=str(clean_queue.conf), timeout_s=20)
    update = ("scontrol", "update")
    try:
        clean_queue.run(
            *update, "PartitionName=shared", "AllowGroups=root,wheel", "AllowQos=normal"
        )
        clean_queue.run(*update, "PartitionName=batch", "DenyAccounts=guest", "DenyQos=normal")
        views = {p.name: p for p in backend.read_partitions()}
        assert views == {p.name: p for p in cli.read_partitions()}
        shared, batch = views["shared"], views["batch"]
        assert (shared.allow_groups, shared.allow_qos) == (("root", "wheel"), ("normal",))
        assert (shared.allow_accounts, shared.deny_qos) == (None, ())
        assert (batch.deny_accounts, batch.deny_qos) == (("guest",), ("normal",))
        assert (batch.allow_groups, batch.allow_accounts, batch.allow_qos) == (None, None, None)
    finally:
        clean_queue.run("scontrol", "reconfigure")

        def restored() -> bool:
            try:
                parts = cli.read_partitions()
            except SlurmUnreachable:  # 24.11 on: reconfigure restarts slurmctld
                return False
            return all(p.allow_qos is None and p.deny_qos == () for p in parts)

        wait_until(restored, 30, "slurm.conf's partitions back")


# The JSON generation a plain --json writes, per version, unless the site chose another
# (DataParserParameters: test-matrix.sh's parser leg).
JSON_PLUGIN = {
    "22.05": "openapi/v0.0.38",
    "24.11": "data_parser/v0.0.42",
    "26.05": "data_parser/v0.0.45",
}


def test_probe(backend: CliBackend, clean_queue: SlurmCluster) -> None:
    caps = backend.probe()
    assert caps.version.startswith(f"{clean_queue.version}.")
    site = site_settings().get("DataParserParameters")
    assert caps.json_plugin == (f"data_parser/{site}" if site else JSON_PLUGIN[clean_queue.version])
    assert caps.multiple_slurmd is True
    assert caps.permit_job_expansion is False
    # 22.05: reconfigure after a shrunk job ends; not assumed of the other versions.
    assert caps.leaks_nodes_after_shrink is (clean_queue.version == "22.05")


def test_reconfigure(backend: CliBackend, clean_queue: SlurmCluster) -> None:
    before = backend.runner.action_calls
    backend.reconfigure()
    assert backend.runner.action_calls == before + 1
    # slurmctld re-read its configuration and still schedules.
    job_id = sbatch(clean_queue, "-N1", "-p", "shared")
    wait_state(backend, job_id, JobState.RUNNING)


def test_hetjob_components_read_with_raw_ids(
    backend: CliBackend, clean_queue: SlurmCluster, shared_dir_tmp: Path
) -> None:
    script = shared_dir_tmp / "het.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH -N1 -o /dev/null\n#SBATCH hetjob\n#SBATCH -N1\nsleep 300\n"
    )
    out = clean_queue.run("sbatch", "--parsable", str(script)).stdout
    leader = int(out.strip().split(";")[0])
    try:
        wait_state(backend, leader, JobState.RUNNING)
        components = sorted(
            (j for j in backend.read_jobs() if j.het_job_id == leader), key=lambda j: j.job_id
        )
        assert [(j.job_id, j.het_job_offset) for j in components] == [
            (leader, 0),
            (leader + 1, 1),
        ]
        assert all(j.is_het and len(j.nodes) == 1 for j in components)
    finally:
        # clean_queue's squeue -o %i parsing does not know "N+0" ids: leave none behind.
        backend.cancel(leader)
        wait_until(
            lambda: "+" not in clean_queue.run("squeue", "-h", "-o", "%i").stdout,
            20,
            "the het job to leave the queue",
        )


# --------------------------------------------------------------------------- shrink / pin


def test_shrink_running_4_to_2_frees_nodes_and_keeps_batch_host(
    backend: CliBackend, clean_queue: SlurmCluster, heal_after_shrink: None
) -> None:
    job_id = sbatch(clean_queue, "-N4")
    before = wait_state(backend, job_id, JobState.RUNNING)
    assert len(before.nodes) == 4
    backend.shrink(job_id, 2)
    after = job(backend, job_id)
    assert after.state is JobState.RUNNING
    assert after.nodes == before.nodes[:2]
    assert after.batch_host in after.nodes
    freed = set(before.nodes[2:])
    wait_until(lambda: freed <= idle_nodes(clean_queue), 10, f"{freed} idle")


def test_shrink_to_one_keeps_the_batch_host(
    backend: CliBackend, clean_queue: SlurmCluster, heal_after_shrink: None
) -> None:
    job_id = sbatch(clean_queue, "-N3")
    before = wait_state(backend, job_id, JobState.RUNNING)
    backend.shrink(job_id, 1)
    assert job(backend, job_id).nodes == (before.batch_host,)


def test_slurm_refuses_to_remove_the_batch_host_with_its_own_message(
    backend: CliBackend, clean_queue: SlurmCluster
) -> None:
    job_id = sbatch(clean_queue, "-N2")
    view = wait_state(backend, job_id, JobState.RUNNING)
    other = next(n for n in view.nodes if n != view.batch_host)
    with pytest.raises(SlurmRejected) as info:
        backend.runner.act(("scontrol", "update", f"JobId={job_id}", f"NodeList={other}"))
    assert "Invalid node name specified" in info.value.slurm_message
    assert "\n" not in str(info.value)
    assert job(backend, job_id).nodes == view.nodes


def test_pending_n4_pinned_to_2_starts_on_2_nodes(
    backend: CliBackend, clean_queue: SlurmCluster
) -> None:
    blocker = sbatch(clean_queue, "-N2")
    wait_state(backend, blocker, JobState.RUNNING)
    job_id = sbatch(clean_queue, "-N4")
    pending = job(backend, job_id)
    assert pending.state is JobState.PENDING and pending.min_nodes == 4
    backend.pin_pending_size(job_id, 2)
    started = wait_state(backend, job_id, JobState.RUNNING, timeout=30)
    assert len(started.nodes) == 2
    assert not set(started.nodes) & set(job(backend, blocker).nodes)


def test_a_job_of_two_partitions_starts_in_the_one_chosen_and_never_in_another(
    backend: CliBackend, clean_queue: SlurmCluster
) -> None:
    """``Partition=P`` with the size, for placing a job by GPU type; Slurm would let root
    set any partition, the backend only narrows to one the job asked for, and gives a
    narrowed job back only the partitions it was submitted to."""
    job_id = sbatch(clean_queue, "-p", "shared,batch", "-N1", "--hold")
    pending = job(backend, job_id)
    submitted = pending.partitions
    assert set(submitted) == {"shared", "batch"}
    sent = actions_sent(backend)
    with pytest.raises(ActionRefused, match="only narrows"):
        backend.pin_pending_size(job_id, 2, partition="debug")
    assert actions_sent(backend) == sent  # nothing was sent to Slurm
    backend.pin_pending_size(job_id, 2, partition="batch")
    pinned = job(backend, job_id)
    assert pinned.partitions == ("batch",) and pinned.min_nodes == 2
    # Given back (the plan did not start it where it was placed): both, never another.
    with pytest.raises(ActionRefused, match="'debug'"):
        backend.pin_pending_size(job_id, 2, partition="batch,debug", submitted=submitted)
    backend.pin_pending_size(job_id, 2, partition=",".join(submitted), submitted=submitted)
    assert set(job(backend, job_id).partitions) == {"shared", "batch"}
    backend.pin_pending_size(job_id, 2, partition="batch", submitted=submitted)
    pinned = job(backend, job_id)
    assert pinned.partitions == ("batch",) and pinned.min_nodes == 2
    clean_queue.run("scontrol", "release", str(job_id))
    started = wait_state(backend, job_id, JobState.RUNNING)
    assert started.partition == "batch" and len(started.nodes) == 2


def test_invalid_actions_are_refused_before_reaching_slurm(
    backend: CliBackend, clean_queue: SlurmCluster
) -> None:
    pending = sbatch(clean_queue, "-N1", "--hold")
    running = sbatch(clean_queue, "-N2")
    wait_state(backend, running, JobState.RUNNING)
    sent = backend.runner.action_calls
    with pytest.raises(ActionRefused, match="must be a positive integer"):
        backend.shrink(running, 0)
    with pytest.raises(ActionRefused, match="it is PENDING, not RUNNING"):
        backend.shrink(pending, 1)
    with pytest.raises(ActionRefused, match="not a shrink"):
        backend.shrink(running, 2)
    with pytest.raises(ActionRefused, match="it is RUNNING, not PENDING"):
        backend.pin_pending_size(running, 1)
    with pytest.raises(ActionRefused, match="no such job"):
        backend.shrink(999_999, 1)
    assert backend.runner.action_calls == sent  # nothing was sent to Slurm
    assert len(job(backend, running).nodes) == 2


def test_slurm_rejection_carries_slurms_message(
    backend: CliBackend, clean_queue: SlurmCluster
) -> None:
    pending = sbatch(clean_queue, "-N1", "--hold")
    with pytest.raises(SlurmRejected) as info:
        backend.set_admin_comment(999_999, "x")
    assert info.value.slurm_message == "Invalid job id specified for job 999999"
    with pytest.raises(SlurmRejected) as info:
        backend.requeue(pending)  # a pending job cannot be requeued
    assert info.value.slurm_message == f"Job is pending execution for job {pending}"
    assert info.value.command == ("scontrol", "requeue", str(pending))
    backend.cancel(999_999)  # 22.05's scancel exits 0, silently, for an unknown job


# --------------------------------------------------------------------------- signals


def test_signal_reaches_batch_shell_or_steps(
    backend: CliBackend, clean_queue: SlurmCluster, shared_dir_tmp: Path
) -> None:
    d = shared_dir_tmp
    script = (
        "#!/bin/bash\n"
        f"trap 'echo batch >> {d}/batch' USR1\n"
        f'srun -N2 bash -c \'trap "echo step >> {d}/step-$SLURMD_NODENAME" USR1; '
        "touch " + str(d) + "/ready-$SLURMD_NODENAME; while :; do sleep 0.1; done' &\n"
        "while :; do sleep 0.1; done\n"
    )
    job_id = sbatch(clean_queue, "-N2", script=script)
    view = wait_state(backend, job_id, JobState.RUNNING)
    wait_until(lambda: len(list(d.glob("ready-*"))) == 2, 20, "both step tasks started")
    backend.signal(job_id, "USR1", batch_only=True)
    wait_until(lambda: (d / "batch").exists(), 10, "the batch shell got USR1")
    assert not list(d.glob("step-*"))
    backend.signal(job_id, "SIGUSR1", batch_only=False)
    wait_until(lambda: len(list(d.glob("step-*"))) == 2, 10, "every step task got USR1")
    assert (d / "batch").read_text().count("batch") == 1  # the batch shell was not signalled
    assert {p.name for p in d.glob("step-*")} == {f"step-{n}" for n in view.nodes}
    with pytest.raises(ActionRefused, match="not a signal name"):
        backend.signal(job_id, "USR1; rm -rf /", batch_only=True)


# --------------------------------------------------------------------------- lifecycle


def test_requeue_and_cancel(backend: CliBackend, clean_queue: SlurmCluster) -> None:
    job_id = sbatch(clean_queue, "-N1", "-p", "shared")
    wait_state(backend, job_id, JobState.RUNNING)
    backend.requeue(job_id)
    requeued = wait_state(backend, job_id, JobState.PENDING, timeout=15)
    assert requeued.restart_count == 1
    backend.cancel(job_id)
    assert job(backend, job_id).state is JobState.CANCELLED
    listed = {j.job_id: j for j in backend.read_jobs()}
    assert listed[job_id].state is JobState.CANCELLED  # squeue --json lists ended jobs too


def test_set_admin_comment(backend: CliBackend, clean_queue: SlurmCluster) -> None:
    job_id = sbatch(clean_queue, "-N1", "-p", "shared", "--comment=user note")
    wait_state(backend, job_id, JobState.RUNNING)
    backend.set_admin_comment(job_id, "slurm-elastic: target 2 (marginal-gain)")
    listed = {j.job_id: j for j in backend.read_jobs()}
    assert listed[job_id].admin_comment == "slurm-elastic: target 2 (marginal-gain)"
    assert listed[job_id].comment == "user note"  # the user's comment is untouched
    with pytest.raises(ActionRefused, match="one line"):
        backend.set_admin_comment(job_id, "two\nlines")


def test_submit_as_unprivileged_user(
    backend: CliBackend,
    clean_queue: SlurmCluster,
    shared_dir_tmp: Path,
    two_users: tuple[ClusterUser, ClusterUser],
) -> None:
    # A user with a login shell: companions start from their owner's login environment
    # (--export=NONE), which 26.05 holds a job for when it cannot read it (nobody's nologin).
    alice, _ = two_users
    script = f"#!/bin/bash\nid -u > {shared_dir_tmp}/uid\nsleep 300\n"
    job_id = backend.submit(
        script,
        user=alice.name,
        nodes=1,
        partition="shared",
        name="companion-test",
        comment="slurm-elastic:companion-of=1",
        work_dir=str(shared_dir_tmp),
        extra_args=("--output=/dev/null",),
    )
    view = wait_state(backend, job_id, JobState.RUNNING)
    assert (view.user, view.name, view.partition) == (alice.name, "companion-test", "shared")
    assert view.comment == "slurm-elastic:companion-of=1"
    assert view.work_dir == str(shared_dir_tmp)
    uid = shared_dir_tmp / "uid"  # created by the shell's ">" before id writes to it
    wait_until(lambda: uid.exists() and uid.read_text().strip() != "", 10, "the job wrote its uid")
    assert (shared_dir_tmp / "uid").read_text().strip() == str(alice.uid)  # not root
    with pytest.raises(ActionRefused, match="no such user"):
        backend.submit(script, user="no-such-user-x", nodes=1, partition="shared")


def test_read_history_collapses_a_resized_job(
    backend: CliBackend, clean_queue: SlurmCluster, heal_after_shrink: None
) -> None:
    since = time.time() - 2
    job_id = sbatch(clean_queue, "-N3", "--comment=history test")
    wait_state(backend, job_id, JobState.RUNNING)
    # sacct stores times in whole seconds: a resize in the second the job started (or the
    # previous resize happened) leaves a zero-length record, so space every change out.
    time.sleep(1.1)
    backend.shrink(job_id, 2)
    time.sleep(1.1)
    backend.shrink(job_id, 1)
    time.sleep(1.1)
    backend.cancel(job_id)

    def collapsed() -> bool:
        found = [h for h in backend.read_history(since) if h.job_id == job_id]
        return bool(found) and found[0].state is JobState.CANCELLED

    wait_until(collapsed, 15, "sacct to record the end of the job")
    (text,) = [h for h in backend.read_history(since, time.time() + 5) if h.job_id == job_id]
    assert [a.node_count for a in text.allocations] == [3, 2, 1]
    assert text.comment == "history test"  # comments reach sacct when the job ends
    for earlier, later in zip(text.allocations, text.allocations[1:], strict=False):
        assert later.start == earlier.end and set(later.nodes) < set(earlier.nodes)
    json_backend = CliBackend(slurm_conf=str(clean_queue.conf), history_format="json")
    (from_json,) = [h for h in json_backend.read_history(since) if h.job_id == job_id]
    assert from_json == text


# --------------------------------------------------------------------------- failures


def test_dry_run_records_actions_and_changes_nothing(
    clean_queue: SlurmCluster, backend: CliBackend, new_backend: Factory
) -> None:
    job_id = sbatch(clean_queue, "-N2")
    wait_state(backend, job_id, JobState.RUNNING)
    dry = new_backend(slurm_conf=str(clean_queue.conf), dry_run=True)
    dry.shrink(job_id, 1)
    dry.signal(job_id, "USR1", batch_only=True)
    dry.cancel(job_id)
    dry.reconfigure()
    assert actions_sent(dry) == 0
    assert dry.runner.dry_run_log == [
        ("scontrol", "update", f"JobId={job_id}", "NumNodes=1"),
        ("scancel", "--signal=USR1", "--batch", str(job_id)),
        ("scancel", str(job_id)),
        ("scontrol", "reconfigure"),
    ]
    view = job(backend, job_id)
    assert view.state is JobState.RUNNING and len(view.nodes) == 2


def broken_copy(cluster: SlurmCluster, where: Path, change: str) -> Path:
    """A copy of the cluster's slurm.conf with one ``Key=value`` line replaced."""
    where.mkdir()
    key = change.split("=", 1)[0] + "="
    lines = [
        change if line.startswith(key) else line
        for line in cluster.conf.read_text().splitlines()
        if not line.startswith(("JobSubmitPlugins", "MessageTimeout"))
    ]
    (where / "slurm.conf").write_text("\n".join([*lines, "MessageTimeout=2", ""]))
    for name in ("gres.conf", "cgroup.conf"):
        (where / name).write_text((cluster.conf.parent / name).read_text())
    return where / "slurm.conf"


def _one_conf_per_process(new_backend: Factory) -> bool:
    module = getattr(new_backend, "pyslurm_module", None)
    return module is not None and not str(module.__version__).startswith("22.")


def test_unreachable_database_is_typed(
    clean_queue: SlurmCluster, tmp_path: Path, new_backend: Factory
) -> None:
    conf = broken_copy(clean_queue, tmp_path / "dbd", "AccountingStoragePort=6999")
    # History is read through the CLI by both backends: test it through the CLI there.
    build = CliBackend if _one_conf_per_process(new_backend) else new_backend
    for history_format in ("text", "json"):
        dead = build(slurm_conf=str(conf), history_format=history_format)
        with pytest.raises(SlurmUnreachable, match="Problem talking to the database"):
            dead.read_history(time.time() - 60)


def test_unreachable_controller_is_typed(
    clean_queue: SlurmCluster, tmp_path: Path, new_backend: Factory
) -> None:
    conf = broken_copy(clean_queue, tmp_path / "ctld", "SlurmctldPort=17999")
    options = {"timeout_s": 20, "action_attempts": 2, "retry_wait_s": 0.05}
    if _one_conf_per_process(new_backend):
        # pyslurm 23.x on cannot re-initialise libslurm with another slurm.conf in this
        # process (pyslurm_backend's docstring): refused with one line, never a crash.
        with pytest.raises(ConfigError, match=r"serves one slurm\.conf per process"):
            new_backend(slurm_conf=str(conf), **options)
        return
    dead = new_backend(slurm_conf=str(conf), **options)
    read = {"cli": "squeue --json", "pyslurm": "slurm_load_jobs"}[kind_of(dead)]
    with pytest.raises(SlurmUnreachable, match=read):
        dead.read_jobs()  # squeue exits 0 with an empty list: must not read as "no jobs"
    with pytest.raises(SlurmUnreachable, match="Unable to contact slurm controller"):
        dead.read_partitions()
    with pytest.raises(SlurmUnreachable):
        dead.cancel(1)
    assert actions_sent(dead) == 2  # idempotent action retried once, then gave up
    with pytest.raises(SlurmUnreachable, match="scontrol reconfigure"):
        dead.reconfigure()
    assert actions_sent(dead) == 4


# --------------------------------------------------------------------------- both backends


def test_auto_picks_the_pyslurm_build_for_the_running_slurm(
    clean_queue: SlurmCluster, pyslurm_module: Any
) -> None:
    with capture_logs() as logs:
        chosen = make_backend("auto", slurm_conf=str(clean_queue.conf), timeout_s=20)
    assert isinstance(chosen, PyslurmBackend)
    (selected,) = [e for e in logs if e["event"] == "slurm.backend_selected"]
    version = chosen.slurm_version()
    assert selected["reason"] == f"pyslurm {pyslurm_module.__version__} matches Slurm {version}"
    assert selected["pyslurm_from"].endswith("/" + ".".join(version.split(".")[:2]))
    held = sbatch(clean_queue, "-N1", "-p", "shared", "--hold")
    assert job(chosen, held).state is JobState.PENDING


def differences(a: Any, b: Any) -> dict[str, tuple[Any, Any]]:
    return {
        f.name: (getattr(a, f.name), getattr(b, f.name))
        for f in dataclasses.fields(a)
        if getattr(a, f.name) != getattr(b, f.name)
    }


def raw(text: bytes) -> str:
    """An argument that reaches the command as these exact bytes (surrogate escapes)."""
    return os.fsdecode(text)


def described_reasons(cluster: SlurmCluster) -> dict[int, str]:
    """Each job's reason as scontrol shows it: Slurm's description where it has one (22.05
    stores it, squeue --json's state_description; 24.11 composes some, e.g.
    "ReqNodeNotAvail, UnavailableNodes:n[1-4]", which only scontrol and libslurm print)."""
    text = cluster.run("scontrol", "-o", "show", "job").stdout
    return {v.job_id: v.state_reason for v in parse_scontrol_jobs(text)}


def same_moment(cli: CliBackend, py: CliBackend) -> tuple[ClusterSnapshot, ClusterSnapshot]:
    """Both backends' reads of one cluster state: the CLI read before and after the pyslurm
    one must agree, else the scheduler moved something in between and we read again."""
    for _ in range(5):
        before, ours, after = cli.read_cluster(now=0), py.read_cluster(now=0), cli.read_cluster(0)
        if dataclasses.replace(before, slurm_calls=0) == dataclasses.replace(after, slurm_calls=0):
            return before, ours
        time.sleep(0.5)
    pytest.fail("the cluster never held still for two reads")


def test_backends_give_equal_views(
    clean_queue: SlurmCluster, pyslurm_module: Any, heal_after_shrink: None
) -> None:
    conf = str(clean_queue.conf)
    cli = CliBackend(slurm_conf=conf, timeout_s=20)
    py = PyslurmBackend(pyslurm_module, slurm_conf=conf, timeout_s=20)
    since = time.time() - 2
    # Raw non-UTF-8 bytes in user data (argv as bytes via the filesystem encoding).
    clean_queue.run("scontrol", "update", "NodeName=n4", "State=DRAIN", raw(b"Reason=maint x\xffy"))
    try:
        resized = sbatch(clean_queue, "-N3", "-J", "run3", "--comment=elastic")
        wait_state(cli, resized, JobState.RUNNING)
        time.sleep(1.1)  # sacct keeps whole seconds: a resize needs its own second
        cli.shrink(resized, 2)
        cli.set_admin_comment(resized, "slurm-elastic: shrunk 3->2")
        gpus = sbatch(clean_queue, "-p", "shared", "-n1", "--gres=gpu:2", "-w", "n3")
        wait_state(cli, gpus, JobState.RUNNING)
        sbatch(clean_queue, "-N4", "-J", "pend4")
        sbatch(clean_queue, "-N2-4", "-p", "shared", "-t", "30", "--comment=a b | c=d")
        held = sbatch(
            clean_queue,
            "-N1",
            "--hold",
            "-p",
            "shared",
            "-J",
            raw(b"n\xe9me"),
            raw(b"--comment=bad\xffbyte"),
        )
        sbatch(clean_queue, "-N1", "-p", "shared", f"--dependency=afterok:{resized}")
        cluster, ours = same_moment(cli, py)
        described = described_reasons(clean_queue)
    finally:
        clean_queue.run("scontrol", "update", "NodeName=n4", "State=RESUME")

    assert (cluster.slurm_calls, ours.slurm_calls) == (3, read_calls(py, clean_queue.version))
    assert ours.nodes == cluster.nodes and ours.partitions == cluster.partitions
    assert {n.name: n.reason for n in ours.nodes}["n4"] == "maint x\ufffdy"
    mine = {j.job_id: j for j in ours.jobs}
    assert sorted(mine) == sorted(j.job_id for j in cluster.jobs)
    for theirs in cluster.jobs:
        view = mine[theirs.job_id]
        if view.state_reason != theirs.state_reason:  # the documented difference (module doc)
            assert view.state_reason == described[theirs.job_id].replace(" ", "_")
            view = dataclasses.replace(view, state_reason=theirs.state_reason)
        assert view == theirs
    assert (mine[held].name, mine[held].comment) == ("n\ufffdme", "bad\ufffdbyte")
    assert mine[resized].nodes == ("n1", "n2") and mine[gpus].gpus_per_node == 2
    # 22.05's CLI read_job is squeue -j -O (scontrol -o could be forged by a comment's
    # newline), whose fields have no admin comment, resize time or priority; the other
    # versions' is scontrol --json.  The pre-checks read the state, nodes and batch host.
    text_only = {"admin_comment", "resize_time", "priority", "eligible_time"}
    unread = text_only if clean_queue.version == "22.05" else set()
    for job_id in (resized, gpus, held):
        one, other = py.read_job(job_id), cli.read_job(job_id)
        assert set(differences(one, other)) <= unread, differences(one, other)

    # History is sacct on both backends (pyslurm 22.5 drops resize records: below).
    time.sleep(1.1)
    cli.cancel(resized)

    def ended() -> bool:
        found = [h for h in cli.read_history(since) if h.job_id == resized]
        return bool(found) and found[0].state is JobState.CANCELLED

    wait_until(ended, 15, "sacct to record the end of the resized job")
    window = (since, time.time() + 5)
    # slurmdbd takes slurmctld's records in asynchronously: two reads a moment apart may
    # differ (CI on 22.05: the first of two back-to-back reads had 1 of the 4 jobs the
    # second had).  The backends must agree once the database holds still.
    deadline = time.monotonic() + 15
    ours_then, theirs_then = py.read_history(*window), cli.read_history(*window)
    while ours_then != theirs_then and time.monotonic() < deadline:
        time.sleep(0.5)
        ours_then, theirs_then = py.read_history(*window), cli.read_history(*window)
    assert ours_then == theirs_then
    (history,) = [h for h in cli.read_history(*window) if h.job_id == resized]
    assert [a.node_count for a in history.allocations] == [3, 2]
    # Why read_history stays on sacct: pyslurm's accounting API keeps one record per job.
    records = pyslurm_module.db.Jobs.load(pyslurm_module.db.JobFilter(ids=[resized]))
    assert [(j.id, j.num_nodes) for j in records.values()] == [(resized, 2)]
