"""Issue 38, class 2, on every Slurm version: with ``PrivateData=jobs`` the daemon shows each
reader what Slurm shows them, no more.

On 108c305 se-bob's ``squeue`` showed 0 rows and ``scontrol show job`` said "Invalid job id"
for se-alice's job, but the daemon's unauthenticated ``GET /v1/status``, ``slurm-elastic
status`` and the world-readable ``status.json`` showed her job (name, user, size).  Here a
real daemon runs against a cluster restarted with ``PrivateData=jobs``; each user reads
``/v1/status`` with a MUNGE credential made as that user (what ``slurm-elastic status``
sends, ``protocol.get_status``).  Without ``PrivateData`` everyone sees every job: the
other live API tests read it so (``tests/test_api_abuse_live.py``).
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest

from slurm_elastic import protocol
from tests.slurm_cluster import ClusterUser, SlurmCluster, configured, wait_until
from tests.test_daemon_service_process import daemon_process, wait_api

pytestmark = pytest.mark.slurm


def status_as(url: str, user: ClusterUser | None, *, anonymous: bool = False) -> dict:
    """``GET /v1/status`` with a credential made as ``user`` (None: root), or none."""
    headers = {}
    if not anonymous:
        digest = protocol.body_digest(protocol.STATUS_REQUEST)
        cmd = ["munge", "-s", digest]
        if user is not None:
            cmd = ["runuser", "-u", user.name, "--", *cmd]
        credential = subprocess.run(cmd, capture_output=True, check=True, timeout=10)
        headers[protocol.HEADER] = credential.stdout.decode().strip()
    request = urllib.request.Request(f"{url}/v1/status", method="GET", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def job_ids(document: dict) -> list[int]:
    return sorted(int(row["job_id"]) for row in document["jobs"])


def test_with_private_jobs_each_reader_sees_only_what_slurm_shows_them(
    slurm_cluster: SlurmCluster,
    two_users: tuple[ClusterUser, ClusterUser],
    tmp_path: Path,
) -> None:
    alice, bob = two_users
    with configured(slurm_cluster, ["PrivateData=jobs"]) as cluster:
        held = ("--hold", "-N1", "--comment=elastic", "--wrap", "true")
        alice_job = alice.sbatch("-J", "alice-secret", *held)
        bob_job = bob.sbatch("-J", "bob-own", *held)
        # Slurm itself hides her job from him: the setting is in force.
        assert bob.run("squeue", "-h", "-o", "%i").stdout.split() == [str(bob_job)]
        state = tmp_path / "state"
        config = tmp_path / "slurm-elastic.yaml"
        config.write_text(
            f"mode: shadow\ninterval_s: 1\nstate_dir: {state}\n"
            "api: {bind: 127.0.0.1, port: 0}\n"
            "slurm: {sacct_interval_s: 600, sacct_lookback_s: 0}\n"
        )
        log = tmp_path / "daemon.log"
        with daemon_process(config, log):
            url = wait_api(log, state / "status.json", alice_job)
            wait_until(
                lambda: job_ids(status_as(url, None)) == sorted([alice_job, bob_job]),
                30,
                "root to see both jobs",
            )
            anyone = status_as(url, None, anonymous=True)
            assert anyone["jobs"] == [] and "private" in anyone
            seen_by_bob = status_as(url, bob)
            assert job_ids(seen_by_bob) == [bob_job]
            assert "alice-secret" not in json.dumps(seen_by_bob)
            assert job_ids(status_as(url, alice)) == [alice_job]
            mode = (state / "status.json").stat().st_mode & 0o777
            assert mode == 0o600, oct(mode)
        cluster.run("scancel", str(alice_job), str(bob_job), check=False)
