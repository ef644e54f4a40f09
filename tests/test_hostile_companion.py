"""Hostile-user regression tests for companion jobs on the real cluster (issue 19): a
companion that the root daemon submits as se-alice carries nothing of the daemon's process
-- no variable, no PATH, no limits, no umask -- only its owner's login environment and
Slurm's job variables (class 4); recovery after a crash mid-grow never takes another user's
job for a companion (a lead of the review)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_elastic.actuate.companion import companion_comment
from slurm_elastic.actuate.journal import Journal
from slurm_elastic.actuate.reconcile import reconcile
from slurm_elastic.slurm.cli import CliBackend
from slurm_elastic.slurm.owner import login_umask
from slurm_elastic.types import Action, ActionKind
from tests.slurm_cluster import ClusterUser, SlurmCluster, wait_until

pytestmark = pytest.mark.slurm

SECRET = "s3cret-of-the-daemon"

# What the daemon's executor does for a grow (Executor._submit_companion), run in a process
# of its own that carries the daemon's secrets, umask and limits.
SUBMIT = """
import resource, sys, time
from slurm_elastic.actuate.companion import (
    companion_comment, companion_extra_args, companion_name, companion_script,
)
from slurm_elastic.slurm.cli import CliBackend

parent_id, agent = int(sys.argv[1]), sys.argv[2]
resource.setrlimit(resource.RLIMIT_NOFILE, (777, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
backend = CliBackend()
parent = backend.read_job(parent_id)
print(backend.submit(
    companion_script(parent, agent), user=parent.user, nodes=1, partition=parent.partition,
    account=parent.account or None, qos=parent.qos or None, name=companion_name(parent),
    comment=companion_comment(parent.job_id), work_dir=parent.work_dir or None,
    extra_args=companion_extra_args(parent, time.time()),
))
"""


def _dump_agent(user: ClusterUser, out: Path) -> Path:
    """A stand-in agent, the user's own file, that writes what the companion got."""
    agent = user.home / ".se-companion-agent"
    agent.write_text(
        "#!/bin/sh\n"
        f"{{ env; echo UMASK=$(umask); echo NOFILE=$(ulimit -n); }} > {out}.tmp\n"
        f"mv {out}.tmp {out}\n"
    )
    entry = pwd.getpwnam(user.name)
    os.chown(agent, entry.pw_uid, entry.pw_gid)
    agent.chmod(0o755)
    return agent


def test_companion_gets_its_owners_environment_not_the_daemons(
    clean_queue: SlurmCluster, two_users: tuple[ClusterUser, ClusterUser], tmp_path: Path
) -> None:
    alice, _ = two_users
    out = alice.home / f"companion-env-{os.getpid()}.txt"
    out.unlink(missing_ok=True)
    agent = _dump_agent(alice, out)
    parent = alice.sbatch("--nodes=1", "--wrap", "sleep 120")
    try:
        script = tmp_path / "submit.py"
        script.write_text(SUBMIT)
        repo = str(Path(__file__).resolve().parent.parent)
        daemon_env = {
            **clean_queue.env,
            "PYTHONPATH": repo,
            "SLURM_ELASTIC_TEST_SECRET": SECRET,  # an operator's unit environment file
            "SLURM_SE_SECRET": SECRET,  # sbatch forwards SLURM_* even with --export=NONE
            "SBATCH_EXPORT": "ALL",  # sbatch reads its options from SBATCH_* too
        }
        proc = subprocess.run(
            [sys.executable, str(script), str(parent), str(agent)],
            env=daemon_env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            preexec_fn=lambda: os.umask(0o077),
        )
        assert proc.returncode == 0, proc.stderr
        companion = int(proc.stdout.strip().splitlines()[-1])
        wait_until(out.exists, 60, f"companion {companion} to write its environment")
        got = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    finally:
        clean_queue.run("scancel", "-u", alice.name, check=False)
        agent.unlink(missing_ok=True)
    text = out.read_text()
    out.unlink()
    assert SECRET not in text
    assert not {"SLURM_ELASTIC_TEST_SECRET", "SLURM_SE_SECRET", "SBATCH_EXPORT"} & set(got)
    assert "/root" not in got["PATH"] and "pyenv" not in got["PATH"]
    assert (got["USER"], got["HOME"]) == (alice.name, str(alice.home))
    assert got["SLURM_JOB_USER"] == alice.name and got["SLURM_JOB_ID"] == str(companion)
    assert got["UMASK"] == f"{login_umask(pwd.getpwnam(alice.name)):04o}" != "0077"
    assert got["NOFILE"] != "777"
    assert got["SLURM_EXPORT_ENV"] == "ALL"  # the companion's steps get the job's environment


def test_recovery_after_a_kill_mid_grow_never_adopts_another_users_job(
    clean_queue: SlurmCluster, two_users: tuple[ClusterUser, ClusterUser], tmp_path: Path
) -> None:
    """The daemon died after writing a grow of se-alice's job to its journal and before (or
    while) submitting the companion; se-bob has a job whose comment names her job as its
    parent.  Recovery at start-up rolls the grow back and leaves se-bob's job alone: neither
    adopted (counted in her size, cancelled with her job) nor cancelled."""
    alice, bob = two_users
    parent = alice.sbatch("--hold", "--comment=elastic:min=1,max=2", "--wrap", "true")
    fake = bob.sbatch("--hold", f"--comment={companion_comment(parent)}", "--wrap", "true")
    journal = Journal.in_state_dir(tmp_path)
    grow = Action(ActionKind.GROW, parent, 1, 2, "test", (("companion_nodes", "1"),))
    intent = journal.record_intent(grow, time.time())
    backend = CliBackend()
    report = reconcile(journal, backend, backend.read_cluster(), act=True)
    assert report.adopted == [] and report.rolled_back == [intent] and report.cancelled == []
    assert journal.companions(active_only=False) == ()
    assert fake in clean_queue.active_job_ids()
