"""CliBackend on every Slurm version, without a cluster: each command is answered with the
output captured from that version (tests/fixtures/slurm/<version>, CAPTURED.md there).

What is checked is the backend's choice of commands: ``squeue --json -a -t all``, the
per-version node source (``sinfo --json`` on 22.05, ``scontrol --json show nodes`` from
24.11 on) at a fixed number of calls, the ``squeue -O`` text path, ``sacct -D`` and
``probe()``.  The live tests run the same paths against the real clusters.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_elastic.errors import SlurmParseError, SlurmRejected
from slurm_elastic.slurm import parse_text
from slurm_elastic.slurm.cli import CliBackend
from slurm_elastic.types import JobState
from tests.fakes import AnsweringRunner

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
VERSIONS = ("22.05", "24.11", "26.05")
DEFAULT = {"22.05": "0.0.38", "24.11": "0.0.42", "26.05": "0.0.45"}
SQUEUE_JSON = ("squeue", "--json", "-a", "-t", "all")
SINFO_JSON = ("sinfo", "--json")
SCONTROL_NODES = ("scontrol", "--json", "show", "nodes")
SQUEUE_TEXT = ("squeue", "-h", "-a", "-t", "all")
SQUEUE_ONE = ("squeue", "-h", "-t", "all", "-j")
SCONTROL_JOB = ("scontrol", "--json", "show", "job")


def named(version: str, argv: tuple[str, ...]) -> tuple[str, ...]:
    """``argv`` as the backend sends it once it knows the version: ``--json`` naming the
    version's pinned data_parser (``parse_json.PINNED_PARSERS``); 22.05's takes no name."""
    if version == "22.05":
        return argv
    return tuple(f"--json=v{DEFAULT[version]}" if a == "--json" else a for a in argv)


class CapturedRunner(AnsweringRunner):
    """Answers the reads with one version's captured outputs of one moment; a ``--json``
    naming another data_parser than the captures' fails the test."""

    def __init__(self, version: str, moment: str, *, squeue_stderr: str = "") -> None:
        super().__init__()
        self.version, self.moment, self.squeue_stderr = version, moment, squeue_stderr

    def _file(self, argv: tuple[str, ...]) -> str:
        v, m, g = self.version, self.moment, DEFAULT[self.version]
        for arg in argv:
            if arg.startswith("--json="):
                assert arg == f"--json=v{g}", f"{arg}: not the captures' data_parser v{g}"
        argv = tuple("--json" if a.startswith("--json=") else a for a in argv)
        if argv == SQUEUE_JSON:
            return f"squeue-{m}.{g}.json"
        if argv == SINFO_JSON:  # 24.11+: only its generation is read, any moment serves
            return f"sinfo-{m if v == '22.05' else 'pending'}.{g}.json"
        if argv == SCONTROL_NODES and v != "22.05":
            return f"scontrol-nodes-{m}.{g}.json"
        if argv[:-2] == SQUEUE_TEXT or argv[:-3] == SQUEUE_ONE:  # read_job: every job
            return f"squeue-O-{m}.txt"
        if argv == (*SCONTROL_JOB, "5") and v != "22.05":  # captured for het1 only
            return f"scontrol-show-job-het1.{g}.json"
        if argv[:4] == ("scontrol", "-o", "show", "job"):  # every job: read_job filters
            return f"scontrol-o-show-job-{m}.txt"
        if argv == ("scontrol", "-o", "show", "partition"):
            return "scontrol-o-show-partition.txt"
        if argv == ("scontrol", "--version"):
            return "scontrol-version.txt"
        if argv == ("scontrol", "show", "config"):
            return "scontrol-show-config.txt"
        if argv[:5] == ("sacctmgr", "-n", "-P", "show", "assoc"):
            return "limits/sacctmgr-show-assoc.txt"
        if argv[:5] == ("sacctmgr", "-n", "-P", "show", "qos"):
            return "limits/sacctmgr-show-qos.txt"
        if argv[:4] == ("sacct", "-a", "-D", "--json"):
            return f"sacct.{g}.json"
        if argv[0] == "sacct" and "-D" in argv and "-p" in argv:
            return "sacct-P.txt"
        # What 22.05's scontrol says to --json (measured), or a command the test did not expect.
        raise SlurmRejected(f"{argv[0]} rejected", slurm_message="unrecognized option '--json'")

    def answer(self, argv: tuple[str, ...]) -> tuple[str, str]:
        stdout = (FIXTURES / self.version / self._file(argv)).read_text()
        # The text fixtures were captured with CAPTURE_SEPARATOR: answer in the call's own.
        stdout = stdout.replace(parse_text.CAPTURE_SEPARATOR, call_separator(argv))
        stderr = self.squeue_stderr if argv[:-2] == SQUEUE_TEXT else ""
        return stdout, stderr


def call_separator(argv: tuple[str, ...]) -> str:
    """The separator a text read asked for (squeue -O's field suffix, sacct's
    --delimiter); the capture's own for any other command (nothing to replace)."""
    if argv[0] == "squeue" and "-O" in argv:
        return argv[argv.index("-O") + 1].split(",")[0].removeprefix("JobID:0")
    delimiter = next((a for a in argv if a.startswith("--delimiter=")), None)
    return delimiter.removeprefix("--delimiter=") if delimiter else parse_text.CAPTURE_SEPARATOR


@pytest.mark.parametrize("version", VERSIONS)
def test_read_cluster_json_is_three_calls_with_the_versions_node_command(version: str) -> None:
    runner = CapturedRunner(version, "drained")
    backend = CliBackend(runner)
    for _ in range(2):
        snapshot = backend.read_cluster(now=1.0)
        assert snapshot.slurm_calls == 3
        assert [n.name for n in snapshot.nodes] == ["n1", "n2", "n3", "n4"]
        assert snapshot.nodes[3].flags == ("DRAIN",)
        assert {p.name for p in snapshot.partitions} == {"batch", "shared"}
        assert {j.job_id for j in snapshot.jobs} == {1, 2, 3, 4}
    nodes_command = SINFO_JSON if version == "22.05" else SCONTROL_NODES
    partitions = ("scontrol", "-o", "show", "partition")
    # The first read takes the site's default generation; from then on every JSON read
    # names the version's pinned data_parser.
    assert runner.argvs[:4] == [
        SQUEUE_JSON,
        named(version, nodes_command),
        partitions,
        named(version, SQUEUE_JSON),
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_read_cluster_text_learns_the_node_command_once(version: str, utc: None) -> None:
    """Without a JSON document to tell the version, sinfo --json is read once: the answer
    on 22.05, a pointer to scontrol on 24.11+ (one extra call, the first time only)."""
    runner = CapturedRunner(version, "pending")
    backend = CliBackend(runner, job_format="text")
    first, second = backend.read_cluster(), backend.read_cluster()
    assert first.slurm_calls == (3 if version == "22.05" else 4)
    assert second.slurm_calls == 3
    assert first.nodes == second.nodes and len(first.nodes) == 4
    jobs = {j.job_id: j for j in second.jobs}
    assert (jobs[3].min_nodes, jobs[3].max_nodes, jobs[3].state) == (2, 4, JobState.PENDING)


def test_a_failed_node_read_forgets_the_node_command() -> None:
    """After an upgrade (22.05 -> 24.11) the remembered sinfo --json no longer lists nodes:
    that read fails, and the next one asks again."""
    runner = CapturedRunner("22.05", "pending")
    backend = CliBackend(runner, job_format="text")
    backend.read_nodes()
    runner.version = "24.11"
    with pytest.raises(SlurmParseError, match="lists no nodes one by one"):
        backend.read_nodes()
    assert len(backend.read_nodes()) == 4
    assert runner.argvs[-2:] == [SINFO_JSON, named("24.11", SCONTROL_NODES)]


@pytest.mark.parametrize("version", VERSIONS)
def test_squeue_text_with_an_unknown_field_is_an_error(version: str) -> None:
    """squeue -O with an unknown field name prints an error and exits 0 (24.11.5)."""
    stderr = "squeue: error: Invalid job format specification: AdminComment\n"
    backend = CliBackend(
        CapturedRunner(version, "pending", squeue_stderr=stderr), job_format="text"
    )
    with pytest.raises(SlurmParseError, match="Invalid job format specification: AdminComment"):
        backend.read_jobs()


@pytest.mark.parametrize("version", VERSIONS)
def test_probe(version: str) -> None:
    runner = CapturedRunner(version, "pending")
    backend = CliBackend(runner)
    caps = backend.probe()
    assert caps.version.startswith(f"{version}.")
    family = "openapi" if version == "22.05" else "data_parser"
    assert caps.json_plugin == f"{family}/v{DEFAULT[version]}"
    assert caps.leaks_nodes_after_shrink is (version == "22.05")
    assert caps.multiple_slurmd is True
    calls = runner.calls
    backend.read_nodes()  # probe's sinfo --json already named the node command
    assert runner.calls == calls + 1


@pytest.mark.parametrize("version", VERSIONS)
def test_association_limits_are_this_clusters_one_call_a_read(version: str) -> None:
    """slurmdbd serves every cluster of the site: only this one's associations bind its
    jobs, so the read names the cluster (slurm.conf's ClusterName, read once)."""
    runner = CapturedRunner(version, "pending")
    backend = CliBackend(runner)
    assert backend.read_assoc_node_limits()[("default", "se-alice", "")] == 2
    assert backend.read_qos_node_limits() == {"se-cluster3-part2": 2}
    calls = runner.calls
    assert backend.read_assoc_node_limits()[("default", "se-bob", "shared")] == 3
    assert runner.calls == calls + 1
    cluster = "cluster2" if version == "22.05" else "cluster3"  # the captured configs'
    assert [a for a in runner.argvs if a[0] == "scontrol"] == [("scontrol", "show", "config")]
    assert [a[5] for a in runner.argvs if a[:5] == ("sacctmgr", "-n", "-P", "show", "assoc")] == [
        f"cluster={cluster}"
    ] * 2


@pytest.mark.parametrize("version", VERSIONS)
def test_read_job_is_json_where_scontrol_has_it(version: str, utc: None) -> None:
    """read_job: scontrol --json show job on 24.11+, squeue -j ID -O with a fresh
    separator on 22.05 (free text can neither break nor forge a record in either; 22.05's
    scontrol -o could be forged); learnt from one sinfo --json at most."""
    runner = CapturedRunner(version, "het")
    backend = CliBackend(runner)
    leader = backend.read_job(5)
    assert leader is not None and (leader.het_job_id, leader.het_job_offset) == (5, 0)
    assert leader.state is JobState.RUNNING
    assert runner.argvs[0] == SINFO_JSON and len(runner.argvs) == 2

    def one_job(argv: tuple[str, ...]) -> bool:
        if version == "22.05":
            return argv[:-2] == (*SQUEUE_ONE, "5") and argv[-2] == "-O"
        return argv == (*named(version, SCONTROL_JOB), "5")

    assert one_job(runner.argvs[1])
    backend.read_cluster()  # 22.05's node read is sinfo --json again; none on 24.11+
    backend.read_job(5)
    assert one_job(runner.argvs[-1]) and runner.argvs.count(SINFO_JSON) == (
        2 if version == "22.05" else 1
    )
    if version == "22.05":  # a fresh separator per call
        assert runner.argvs[1][-1] != runner.argvs[-1][-1]


@pytest.mark.parametrize("history_format", ["text", "json"])
@pytest.mark.parametrize("version", VERSIONS)
def test_history_keeps_requeued_runs(version: str, history_format: str, utc: None) -> None:
    runner = CapturedRunner(version, "sacct")
    backend = CliBackend(runner, history_format=history_format)
    history = {h.job_id: h for h in backend.read_history(0.0)}
    assert len(history[7].allocations) == 1  # requeue1's run before its requeue
    assert [a.node_count for a in history[1].allocations] == [4, 2]
    assert "-D" in runner.argvs[-1]
