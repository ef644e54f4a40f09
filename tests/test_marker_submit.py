"""etc/job_submit.lua inside the real slurmctld: sbatch rejects a malformed marker with
the marker module's message, passes good markers (completing them), leaves others alone."""

from __future__ import annotations

import re

import pytest

from slurm_elastic.errors import MarkerError
from slurm_elastic.marker import check_submission, complete_marker, parse_marker
from tests.slurm_cluster import ClusterUser, SlurmCluster

pytestmark = pytest.mark.slurm


def sbatch(cluster: SlurmCluster, *args: str) -> tuple[int | None, str]:
    """Submit a held no-op job; (job id or None, sbatch's stderr)."""
    proc = cluster.run(
        "sbatch", "--parsable", "--hold", "-o", "/dev/null", *args, "--wrap", "true", check=False
    )
    job_id = int(proc.stdout.strip().split(";")[0]) if proc.returncode == 0 else None
    return job_id, proc.stderr


def job_fields(cluster: SlurmCluster, job_id: int) -> tuple[str, str]:
    """(comment, NumNodes) as slurmctld stored them."""
    comment = cluster.run("squeue", "-h", "-j", str(job_id), "-o", "%k").stdout.strip()
    line = cluster.run("scontrol", "-o", "show", "job", str(job_id)).stdout
    match = re.search(r"\bNumNodes=(\S+)", line)
    assert match, line
    return comment, match.group(1)


@pytest.mark.parametrize(
    ("nodes", "comment"),
    [
        ("2-8", "elastic:size=4"),
        ("2-8", "elastic:min=8,max=2"),
        ("2-8", "run 7; elastic:step=4"),
        ("2-8", "elastic/2:min=2"),
        ("2-8", "elastic:min=two"),
        ("4-8", "elastic:min=2"),
        (None, "elastic"),
        # Format directives in the fields the message echoes (slurmctld's log_user is
        # string.format; on 108c305 "%" raised a Lua error and the job was accepted
        # unchecked: issue 38, class 4).
        ("1-999999", "elastic elastic/%"),
        ("2-8", "elastic:min=%s"),
        ("2-8", "elastic:%n=1"),
        ("2-8", "elastic/%d%q"),
    ],
)
def test_malformed_marker_is_rejected_with_the_message(
    clean_queue: SlurmCluster, nodes: str | None, comment: str
) -> None:
    lo, _, hi = (nodes or "").partition("-")
    expected = None
    try:
        check_submission(comment, int(lo) if lo else None, int(hi) if hi else None)
    except Exception as exc:
        expected = str(exc)
    assert expected is not None, "the case must be invalid for the Python checker too"
    args = [f"--nodes={nodes}"] if nodes else []
    job_id, stderr = sbatch(clean_queue, *args, f"--comment={comment}")
    assert job_id is None
    assert f"sbatch: error: {expected}" in stderr
    assert clean_queue.active_job_ids() == []


def test_good_marker_passes_and_is_completed_from_nodes(clean_queue: SlurmCluster) -> None:
    job_id, stderr = sbatch(clean_queue, "--nodes=2-4", "--comment=nightly elastic:step=2")
    assert job_id is not None, stderr
    comment, num_nodes = job_fields(clean_queue, job_id)
    assert comment == "nightly elastic:min=2,max=4,step=2"
    assert comment == complete_marker("nightly elastic:step=2", 2, 4)
    assert num_nodes == "2-4"


def test_full_marker_without_nodes_sets_the_range(clean_queue: SlurmCluster) -> None:
    job_id, stderr = sbatch(clean_queue, "--comment=elastic/1:min=2,max=3,gpus=4")
    assert job_id is not None, stderr
    comment, num_nodes = job_fields(clean_queue, job_id)
    assert comment == "elastic/1:min=2,max=3,gpus=4"
    assert num_nodes == "2-3"
    marker = parse_marker(comment)
    assert marker is not None and marker.gpus_per_node == 4


def test_jobs_without_marker_are_untouched(clean_queue: SlurmCluster) -> None:
    plain, stderr = sbatch(clean_queue, "--nodes=3", "--comment=elasticity study; run=4")
    assert plain is not None, stderr
    assert job_fields(clean_queue, plain) == ("elasticity study; run=4", "3-3")
    bare, stderr = sbatch(clean_queue, "--nodes=1-2")
    assert bare is not None, stderr
    comment, num_nodes = job_fields(clean_queue, bare)
    assert comment in {"", "(null)"}
    assert num_nodes == "1-2"


def test_companion_comment_passes_untouched(clean_queue: SlurmCluster) -> None:
    job_id, stderr = sbatch(clean_queue, "--nodes=1", "--comment=slurm-elastic:companion-of=99")
    assert job_id is not None, stderr
    assert job_fields(clean_queue, job_id) == ("slurm-elastic:companion-of=99", "1-1")


def test_hostile_range_is_capped_at_what_the_partitions_give(
    clean_queue: SlurmCluster, two_users: tuple[ClusterUser, ClusterUser]
) -> None:
    """se-bob's max=999999 and -N1-999999 are stored capped at the cluster's 4 nodes (so the
    daemon never plans a million sizes); a min above them is refused with the reason."""
    _, bob = two_users
    nodes = len(clean_queue.nodes)
    hostile = [
        ("--comment=elastic:min=1,max=999999",),
        ("--nodes=1-999999", "--comment=elastic"),
        ("--nodes=1-999999", "--comment=elastic:min=1,max=999999"),
    ]
    for args in hostile:
        job_id = bob.sbatch("--hold", *args, "--wrap", "true")
        comment, num_nodes = job_fields(clean_queue, job_id)
        assert comment == f"elastic:min=1,max={nodes}", args
        assert num_nodes == f"1-{nodes}", args
    proc = bob.run(
        "sbatch", "--hold", "-o", "/dev/null", f"--nodes={nodes + 1}", "--comment=elastic",
        "--wrap", "true", check=False,
    )  # fmt: skip
    expected = f"min={nodes + 1} is more than the {nodes} nodes its partitions can give"
    assert proc.returncode != 0 and expected in proc.stderr
    # A job without the marker is Slurm's business alone: untouched.
    plain = bob.sbatch("--hold", "--nodes=1-999999", "--comment=plain", "--wrap", "true")
    assert job_fields(clean_queue, plain) == ("plain", "1-999999")


def test_format_directives_of_an_unprivileged_user_are_refused_with_one_line(
    clean_queue: SlurmCluster, two_users: tuple[ClusterUser, ClusterUser]
) -> None:
    """Issue 38, class 4, as se-bob: the option's check (the SPANK plugin) and the
    comment's (job_submit.lua, which slurmctld runs for him as for root) refuse his format
    directives with one line each, never a job accepted unchecked (on 108c305 his ``%``
    raised a Lua error and slurmctld took the job as a rigid one)."""
    _, bob = two_users
    cases = [
        (("--elastic=1-2%",), "invalid --elastic=1-2%: '1-2%' is not a node range MIN-MAX"),
        (("--nodes=1-999999", "--comment=elastic elastic/%"), None),
        (("--nodes=2-8", "--comment=elastic:%n=1"), None),
    ]
    for args, message in cases:
        if message is None:  # the marker module's own words, as job_submit.lua says them
            comment = args[1].partition("=")[2]
            lo, _, hi = args[0].partition("=")[2].partition("-")
            with pytest.raises(MarkerError) as refused:
                check_submission(comment, int(lo), int(hi))
            message = str(refused.value)
        proc = bob.run(
            "sbatch", "--parsable", "--hold", "-o", "/dev/null", *args, "--wrap", "true",
            check=False,
        )  # fmt: skip
        # One line of ours; sbatch adds its own verdict after a job_submit refusal.
        ours = [
            line
            for line in proc.stderr.splitlines()
            if not line.startswith("sbatch: error: Batch job submission failed")
        ]
        assert proc.returncode != 0 and ours == [f"sbatch: error: {message}"], proc.stderr
    assert clean_queue.active_job_ids() == []
