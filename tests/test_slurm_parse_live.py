"""The JSON and text reads of CliBackend agree on a real cluster of the version under test.

Run per version and instance, e.g.
``SLURM_ELASTIC_SLURM=24.11 SLURM_ELASTIC_TEST_INSTANCE=3 pytest -m slurm
tests/test_slurm_parse_live.py``.  The fixture-based twin is test_slurm_parse_versions.py;
this one checks the same quirks against what the cluster prints today.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import pytest

from slurm_elastic.slurm.cli import CliBackend
from slurm_elastic.slurm.parse_json import PINNED_PARSERS
from slurm_elastic.slurm.runner import CommandResult, SlurmRunner
from slurm_elastic.types import JobHistory, JobState, JobView
from tests.slurm_cluster import SlurmCluster, wait_until

pytestmark = pytest.mark.slurm


def sbatch(cluster: SlurmCluster, *args: str) -> int:
    out = cluster.run("sbatch", "--parsable", "-o", "/dev/null", *args, "--wrap", "sleep 300")
    return int(out.stdout.strip().split(";")[0])


def state_of(cluster: SlurmCluster, job_id: int) -> str:
    return cluster.run("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False).stdout.strip()


def by_id(views: tuple[JobView, ...]) -> dict[int, JobView]:
    return {v.job_id: v for v in views}


def cancelled_history(
    cluster: SlurmCluster, job_id: int, since: float
) -> tuple[JobHistory, JobHistory]:
    """Cancel the job, wait for sacct to record it, and read its history from the text and
    the JSON accounting reads: (text, json)."""
    cluster.run("scancel", str(job_id))
    text = CliBackend(slurm_conf=str(cluster.conf))
    json = CliBackend(slurm_conf=str(cluster.conf), history_format="json")

    def recorded() -> bool:
        found = [h for h in text.read_history(since) if h.job_id == job_id]
        return bool(found) and found[0].state is JobState.CANCELLED

    wait_until(recorded, 20, "sacct to record the cancellation")
    (from_text,) = [h for h in text.read_history(since) if h.job_id == job_id]
    (from_json,) = [h for h in json.read_history(since) if h.job_id == job_id]
    return from_text, from_json


@pytest.fixture
def backends(clean_queue: SlurmCluster) -> tuple[CliBackend, CliBackend]:
    conf = str(clean_queue.conf)
    return CliBackend(slurm_conf=conf), CliBackend(slurm_conf=conf, job_format="text")


def test_pending_ranges_read_the_same_on_json_and_text(
    clean_queue: SlurmCluster, backends: tuple[CliBackend, CliBackend]
) -> None:
    """A pending -N2-4 job shows the scheduler's estimate (4) as its node count once looked
    at; both paths must give min 2, max 4 (and the same for the other shapes)."""
    json_backend, text_backend = backends
    blocker = sbatch(clean_queue, "-N4")
    wait_until(lambda: state_of(clean_queue, blocker) == "RUNNING", 30, "the blocker to run")
    comment = "free text JobState=FAKE | pipe"
    shapes = {
        sbatch(clean_queue, "-N2-4", f"--comment={comment}"): (2, 4),
        sbatch(clean_queue, "-N2-3", "-p", "shared"): (2, 3),
        sbatch(clean_queue, "-N4"): (4, 4),
        sbatch(clean_queue, "-N1-3", "--hold"): (1, 3),
    }
    range24 = next(iter(shapes))

    def estimated() -> bool:  # squeue's %D of a pending range: the scheduler's estimate
        out = clean_queue.run("squeue", "-h", "-j", str(range24), "-o", "%D").stdout
        return out.strip() == "4"

    wait_until(estimated, 30, "the scheduler to look at the pending range")
    from_json = by_id(json_backend.read_jobs())
    from_text = by_id(text_backend.read_jobs())
    for job_id, (low, high) in shapes.items():
        for view in (from_json[job_id], from_text[job_id], json_backend.read_job(job_id)):
            assert view is not None and view.state is JobState.PENDING
            assert (view.node_count, view.min_nodes, view.max_nodes) == (low, low, high)
        assert from_json[job_id].nodes == from_text[job_id].nodes == ()
    assert from_json[range24].comment == from_text[range24].comment == comment
    running_json, running_text = from_json[blocker], from_text[blocker]
    for name in ("state", "nodes", "node_count", "min_nodes", "max_nodes", "batch_host",
                 "gpus_per_node", "start_time", "end_time", "time_limit_s"):  # fmt: skip
        assert getattr(running_json, name) == getattr(running_text, name), name


def test_nodes_idle_mixed_and_allocated(
    clean_queue: SlurmCluster, backends: tuple[CliBackend, CliBackend]
) -> None:
    """Nodes come from sinfo --json on 22.05 and scontrol --json show nodes after; a fresh
    backend finds out which by itself."""
    json_backend, _ = backends
    one_cpu = sbatch(clean_queue, "-p", "shared", "-n1")
    whole = sbatch(clean_queue, "-N1")
    for job_id in (one_cpu, whole):
        wait_until(lambda j=job_id: state_of(clean_queue, j) == "RUNNING", 30, f"{job_id} running")
    nodes = {n.name: n for n in json_backend.read_nodes()}
    assert sorted(n.state for n in nodes.values()) == ["allocated", "idle", "idle", "mixed"]
    mixed = next(n for n in nodes.values() if n.state == "mixed")
    assert mixed.alloc_cpus == 1 and mixed.cpus == 4 and all(n.is_usable for n in nodes.values())
    command = json_backend.runner.calls
    json_backend.read_nodes()
    assert json_backend.runner.calls == command + 1  # learnt once, then one call


def test_history_keeps_a_requeued_run_on_json_and_text(
    clean_queue: SlurmCluster, backends: tuple[CliBackend, CliBackend]
) -> None:
    """24.11+ leave a requeued job's earlier run out of sacct --json without -D."""
    since = time.time() - 2
    job_id = sbatch(clean_queue, "-N1", "-p", "shared")
    wait_until(lambda: state_of(clean_queue, job_id) == "RUNNING", 30, "the job to run")
    time.sleep(1.1)  # sacct's whole seconds: a requeue in the start second leaves no period
    clean_queue.run("scontrol", "requeue", str(job_id))
    wait_until(lambda: state_of(clean_queue, job_id) == "PENDING", 30, "the requeue")
    from_text, from_json = cancelled_history(clean_queue, job_id, since)
    assert len(from_text.allocations) == 1 and from_text.allocations[0].end is not None
    assert from_json == from_text


def test_a_job_resized_twice_is_one_history_on_json_and_text(clean_queue: SlurmCluster) -> None:
    """Issue 20: every resize leaves a record in sacct; the history the estimator's priors
    read is one job with one allocation per size, on every version (26.05's OriginalSLUID
    or the records' times join them: ``slurm.history``)."""
    since = time.time() - 2
    job_id = sbatch(clean_queue, "-N3", "-p", "batch")
    wait_until(lambda: state_of(clean_queue, job_id) == "RUNNING", 30, "the job to run")
    for nodes in (2, 1):
        time.sleep(1.1)  # sacct's whole seconds: each size gets a period of its own
        clean_queue.run("scontrol", "update", f"JobId={job_id}", f"NumNodes={nodes}")
    time.sleep(1.1)
    from_text, from_json = cancelled_history(clean_queue, job_id, since)
    assert [a.node_count for a in from_text.allocations] == [3, 2, 1]
    periods = from_text.allocations
    assert all(a.end == b.start for a, b in itertools.pairwise(periods)), periods
    assert from_json == from_text


class RecordingRunner(SlurmRunner):
    """The real runner, keeping the argv of every read."""

    def __init__(self, slurm_conf: str) -> None:
        super().__init__(slurm_conf=slurm_conf)
        self.argvs: list[tuple[str, ...]] = []

    def read(
        self, argv: Sequence[str], *, timeout_s: float | None = None, label: str | None = None
    ) -> CommandResult:
        self.argvs.append(tuple(argv))
        return super().read(argv, timeout_s=timeout_s, label=label)


def test_every_json_read_names_the_versions_data_parser(clean_queue: SlurmCluster) -> None:
    """Issue 20: from 24.11 a site can change the default data_parser (slurm.conf
    ``DataParserParameters``; test-matrix.sh's parser leg runs this suite with v0.0.40).
    After start-up's probe every JSON read names the version's pinned parser, so the site's
    choice never changes what is read; 22.05's ``--json`` takes no name."""
    job_id = sbatch(clean_queue, "-N1", "-p", "shared")
    runner = RecordingRunner(str(clean_queue.conf))
    backend = CliBackend(runner, history_format="json")
    caps = backend.probe()
    runner.argvs.clear()
    snapshot = backend.read_cluster()
    backend.read_history(time.time() - 60)
    backend.read_job(job_id)
    assert job_id in {j.job_id for j in snapshot.jobs}
    flags = {a for argv in runner.argvs for a in argv if a.startswith("--json")}
    if clean_queue.version == "22.05":
        assert flags == {"--json"}, runner.argvs
    else:
        assert flags == {f"--json={PINNED_PARSERS[clean_queue.version]}"}, runner.argvs
        assert len([a for a in runner.argvs if "--json" in " ".join(a)]) == 4, runner.argvs
    print(f"site default {caps.json_plugin}; reads with {sorted(flags)}")
