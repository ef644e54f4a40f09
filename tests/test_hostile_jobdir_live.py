"""Issue 38, class 1, on every Slurm version of the matrix: se-alice's job, run by Slurm as
her on two of the cluster's nodes, in a work directory anyone may write (mode 1777), while
se-bob attacks it from a login shell -- first by making ``.slurm-elastic`` before her job
starts, then by racing her job's writes and reads with renames and plants of his own.

Her side is the job side's one access layer (``agent.owndir``, with ``agent.checkpoint`` over
it: what the launcher, the node agents, relaunches and companions read ``launch.json``,
control files and checkpoints through), run by the node's own ``python3`` from a copy of
those standard-library-only modules that she can read: the interpreter with torch lives in
root's home here, which no other user may read (so the live suite's torch jobs run as root;
issue 39 gives the job side a path users can read).  What Slurm adds over that file-system
test: the job's user, umask and environment as slurmd sets them on each version (inside that
version's root for 24.11 and 26.05), and two nodes' tasks reading and writing the directory
at once.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm_cluster import ClusterUser, SlurmCluster, wait_until
from tests.test_hostile_jobdir import ALICE, BOB, RUNUSER, shared_tree

pytestmark = pytest.mark.slurm

JOB_S = 120.0  # her job's limit of waiting (it runs in a few seconds; Slurm may be slow)
ROUNDS = 150  # her accesses per task in the race (each writes and reads two files)


@pytest.fixture
def shared(two_users: tuple[ClusterUser, ClusterUser]) -> Iterator[tuple[Path, Path, Path]]:
    """(the work directory, mode 1777; the modules and scripts anyone may read; a directory
    of her own, for her job's output).  Under /tmp: every node of the cluster, and every
    version's root, sees it at the same path (scripts/cluster.sh binds /tmp into the roots)."""
    alice, _ = two_users
    top = Path(tempfile.mkdtemp(prefix="se-jobdir-live-", dir="/tmp"))
    work, code = shared_tree(top, {"alice.py": ALICE, "bob.sh": BOB})
    out = top / "alice"
    out.mkdir(mode=0o700)
    shutil.chown(out, alice.name, alice.name)
    try:
        yield work, code, out
    finally:
        shutil.rmtree(top, ignore_errors=True)


def run_her_job(
    cluster: SlurmCluster, alice: ClusterUser, work: Path, code: Path, out: Path, rounds: int
) -> dict[str, list[str]]:
    """Her two-node job, each task in a job directory of its own: the lines each task printed
    (by task: ``srun --label``)."""
    log = out / "job.out"
    task = (
        f"cd {work} && PYTHONPATH={code} exec python3 {code}/alice.py {work} {rounds} "
        "job-7-$SLURM_PROCID"
    )
    job = alice.sbatch(
        "-N2", "--ntasks-per-node=1", "-t", "5", "-o", str(log), "--chdir", str(work),
        "--wrap", f"srun --label sh -c '{task}'",
        cwd=out,
    )  # fmt: skip
    wait_until(
        lambda: not cluster.run("squeue", "-h", "-j", str(job)).stdout.strip(),
        JOB_S,
        f"se-alice's job {job} to end",
    )
    by_task: dict[str, list[str]] = {"0": [], "1": []}
    for line in log.read_text(errors="replace").splitlines():
        task_id, _, text = line.partition(": ")
        assert task_id.strip() in by_task, line  # a line srun or Python printed unlabelled
        by_task[task_id.strip()].append(text)
    return by_task


def test_a_slurm_elastic_directory_made_first_by_another_user_is_refused_on_every_node(
    clean_queue: SlurmCluster,
    two_users: tuple[ClusterUser, ClusterUser],
    shared: tuple[Path, Path, Path],
) -> None:
    alice, bob = two_users
    work, code, out = shared
    bob.run("mkdir", "-m", "777", str(work / ".slurm-elastic"))
    lines = run_her_job(clean_queue, alice, work, code, out, rounds=1)
    refusal = (
        f"refused {work}/.slurm-elastic belongs to uid {bob.uid}, not to you (uid "
        f"{alice.uid}): another user made it in a shared work directory; use a work "
        "directory of your own (sbatch --chdir) or have it removed"
    )
    assert lines == {"0": [refusal], "1": [refusal]}, lines
    assert list((work / ".slurm-elastic").iterdir()) == []  # nothing of hers went there


def test_a_racing_second_user_never_gets_his_files_read_on_any_node(
    clean_queue: SlurmCluster,
    two_users: tuple[ClusterUser, ClusterUser],
    shared: tuple[Path, Path, Path],
) -> None:
    alice, bob = two_users
    work, code, out = shared
    racer = subprocess.Popen(
        [RUNUSER, "-u", bob.name, "--", "sh", str(code / "bob.sh"), str(work),
         "job-7-0", "job-7-1"],
        env={"PATH": "/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # He is at it before her job starts (his first plant is there), as in the attack.
        wait_until(lambda: (work / ".slurm-elastic").exists(), 30, "se-bob's first plant")
        by_task = run_her_job(clean_queue, alice, work, code, out, rounds=ROUNDS)
    finally:
        (work / "stop").touch()
        racer.wait(timeout=60)
    for task, lines in by_task.items():
        print(f"race, task {task}: {dict(Counter(line.split(' ', 1)[0] for line in lines))}")
        assert len(lines) >= ROUNDS, (task, lines[-5:])  # the task ran every round
        foreign = [line for line in lines if line.startswith("FOREIGN")]
        assert foreign == [], (task, foreign[:5])
        kinds = {line.split(" ", 1)[0] for line in lines}
        assert kinds <= {"mine", "refused"}, (task, kinds)
        # As in tests/test_hostile_jobdir.py: while his .slurm-elastic is there her job is
        # refused; once hers is there he cannot take it away (the sticky bit, mode 0700).
        if "mine" in lines:
            after = lines[lines.index("mine") :]
            assert set(after) == {"mine"}, (task, [line for line in after if line != "mine"][:3])
        for line in lines:
            if line.startswith("refused"):
                assert "belongs to uid" in line, (task, line)
    for made in (work / ".slurm-elastic").glob("job-7-*"):
        if made.stat().st_uid == alice.uid:  # hers, wherever she got as far as making it
            assert made.stat().st_mode & 0o077 == 0, oct(made.stat().st_mode)
