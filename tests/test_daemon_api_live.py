"""The running daemon's API on the live cluster: job ownership comes from Slurm's own snapshot.

A report about a root-owned job made with ``nobody``'s MUNGE credential is forged: 403.
The owner's (root's) report is accepted and counted.  No Slurm call is made per report.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest

from slurm_elastic import protocol
from tests.test_daemon_service_process import daemon_process, wait_api, write_config


def _nobody_credential(body: bytes) -> str:
    return (
        subprocess.run(
            ["runuser", "-u", "nobody", "--", "munge", "-s", protocol.body_digest(body)],
            capture_output=True,
            check=True,
            timeout=10,
        )
        .stdout.decode()
        .strip()
    )


@pytest.mark.slurm
def test_forged_report_rejected_owner_accepted(clean_queue, tmp_path: Path) -> None:
    job = int(
        subprocess.run(
            ["sbatch", "--parsable", "-N1", "-t", "5", "-p", "shared", "-o", "/dev/null",
             "--comment=elastic", "-J", "api-live", "--wrap", "sleep 300"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip().split(";")[0]
    )  # fmt: skip
    config_file = write_config(tmp_path / "slurm-elastic.yaml", tmp_path / "state")
    log_path = tmp_path / "daemon.log"
    with daemon_process(config_file, log_path):
        url = wait_api(log_path, tmp_path / "state" / "status.json", job)
        report = json.dumps({"step": 10, "nodes": 1, "samples_per_s": 50.0}).encode()
        forged = urllib.request.Request(
            f"{url}/v1/jobs/{job}/report",
            data=report,
            method="POST",
            headers={protocol.HEADER: _nobody_credential(report)},
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(forged, timeout=10)
        assert info.value.code == 403

        accepted = protocol.post_authenticated(f"{url}/v1/jobs/{job}/report", report)
        assert accepted.status == 200
        assert protocol.post_authenticated(f"{url}/v1/jobs/999999/report", report).status == 404

        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        assert "slurm_elastic_reports_total 1.0" in metrics
        assert 'slurm_elastic_auth_failures_total{reason="not_owner"} 1.0' in metrics
        rejected = [
            json.loads(line)
            for line in log_path.read_text().splitlines()
            if '"report.rejected"' in line
        ]
        assert [r["status"] for r in rejected] == [403, 404]
        assert "uid 65534" in rejected[0]["detail"]
