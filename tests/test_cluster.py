"""scripts/cluster.sh on the real machine: the cluster it builds is what CONTRACTS.md says."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from scripts.cluster_env import parse_exports
from tests.slurm_cluster import CLUSTER_SH, SlurmCluster, wait_until

pytestmark = pytest.mark.slurm


def cluster_sh(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **env},
    )


def test_nodes_cpus_gpus_and_partitions(slurm_cluster: SlurmCluster) -> None:
    # Text, not --json: sinfo --json lists no nodes from 23.02 on (the backend's parsers are
    # tested on every version elsewhere; this checks what cluster.sh built).
    lines = slurm_cluster.run("scontrol", "-o", "show", "node").stdout.splitlines()
    by_name = {line.split()[0].removeprefix("NodeName="): line.split() for line in lines}
    assert sorted(by_name) == sorted(slurm_cluster.nodes)
    for fields in by_name.values():
        assert {"CPUTot=4", "Gres=gpu:4", "NodeAddr=127.0.0.1"} <= set(fields)
        assert f"Version={slurm_cluster.version}" in " ".join(fields)
    parts = slurm_cluster.run("scontrol", "-o", "show", "partition").stdout.splitlines()
    fields = {line.split()[0].split("=")[1]: line for line in parts}
    assert set(fields) == {"batch", "shared"}
    assert "Default=YES" in fields["batch"]
    # 26.05 prints OverSubscribe=EXCLUSIVE as Exclusive=NODE (parse_text handles both).
    assert "OverSubscribe=EXCLUSIVE" in fields["batch"] or "Exclusive=NODE" in fields["batch"]
    assert "Default=NO" in fields["shared"] and "OverSubscribe=NO" in fields["shared"]
    config = slurm_cluster.run("scontrol", "show", "config").stdout
    assert f"ClusterName             = {slurm_cluster.cluster_name}" in config
    assert "JobSubmitPlugins        = lua" in config
    assert "MULTIPLE_SLURMD         = yes" in config.replace("= Yes", "= yes")  # 24.11: "yes"


def test_job_runs_on_distinct_fake_nodes_with_gpus_and_reaches_sacct(
    clean_queue: SlurmCluster, tmp_path: Path
) -> None:
    out = tmp_path / "out.txt"
    proc = clean_queue.run(
        "sbatch", "--parsable", "-N2", "--gpus-per-node=4", "--comment=smoke test",
        "-o", str(out),
        "--wrap", "srun bash -c 'echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES'",
    )  # fmt: skip
    job_id = proc.stdout.strip()

    def finished() -> bool:
        return not clean_queue.run("squeue", "-h", "-j", job_id).stdout.strip()

    wait_until(finished, 30, f"job {job_id} to finish")
    lines = sorted(out.read_text().split("\n")[:-1])
    assert lines == ["n1 0,1,2,3", "n2 0,1,2,3"]

    def in_sacct() -> bool:
        res = clean_queue.run(
            "sacct", "-X", "-n", "-P", "-j", job_id, "-o", "state,nnodes,comment", check=False
        )
        return res.stdout.strip() == "COMPLETED|2|smoke test"

    wait_until(in_sacct, 15, f"job {job_id} in sacct with its comment")


def test_up_again_is_a_quick_no_op(slurm_cluster: SlurmCluster) -> None:
    nodes = str(len(slurm_cluster.nodes))
    t0 = time.monotonic()
    proc = cluster_sh("up", "--instance", str(slurm_cluster.instance), "--nodes", nodes)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"instance {slurm_cluster.instance} already up")
    assert elapsed < 10


def test_status_and_env(slurm_cluster: SlurmCluster) -> None:
    which = ("--slurm", slurm_cluster.version, "--instance", str(slurm_cluster.instance))
    status = cluster_sh("status", *which)
    assert status.returncode == 0, status.stdout + status.stderr
    for daemon in ("munged", "mariadbd", "slurmdbd", "slurmctld", *slurm_cluster.nodes):
        assert daemon in status.stdout
    assert "DOWN" not in status.stdout
    assert "batch*" in status.stdout
    env = cluster_sh("env", *which)
    exports = parse_exports(env.stdout)
    assert exports["SLURM_CONF"] == str(slurm_cluster.conf)
    assert exports["SLURM_ELASTIC_SLURM"] == slurm_cluster.version
    # After the exports, the clients on PATH are this version's and talk to this cluster.
    version = subprocess.run(
        ["scontrol", "--version"], env={**os.environ, **exports}, capture_output=True, text=True
    )
    assert version.stdout.split()[1].startswith(slurm_cluster.version), version.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["up", "--nodes", "17"], "--nodes must be an integer 1..16, got '17'"),
        (["up", "--nodes", "08"], "--nodes must be an integer 1..16, got '08'"),
        (["up", "--nodes", "0"], "--nodes must be an integer 1..16, got '0'"),
        (["up", "--instance", "8"], "--instance must be an integer 0..7, got '8'"),
        (["up", "--bogus"], "unknown argument '--bogus'"),
        (
            ["up", "--conf", "Data Parser=v0.0.40"],
            "--conf must be KEY=VALUE (a word; letters, digits, spaces, ._,+/:=[]-), "
            "got 'Data Parser=v0.0.40'",
        ),
        (["up", "--conf", "Key=$(id)"], "--conf must be KEY=VALUE"),
        (
            ["up", "--gpu-types", "a100:2,t4:1"],
            "--gpu-types must be TYPE:COUNT[,TYPE:COUNT]... (TYPE: a-z, 0-9, _, a letter first, "
            "each once, not batch or shared; the COUNTs adding up to --nodes 4), got 'a100:2,t4:1'",
        ),
        (["up", "--nodes", "2", "--gpu-types", "a100:1,a100:1"], "got 'a100:1,a100:1'"),
        (["up", "--gpu-types", "shared:4"], "not batch or shared"),
        (["up", "--gpu-types", "A100:4"], "--gpu-types must be TYPE:COUNT"),
        (["up", "--gpu-types", "a100:4,"], "--gpu-types must be TYPE:COUNT"),
        (["up", "--gpu-types", "a100:0,t4:4"], "--gpu-types must be TYPE:COUNT"),
        (["up", "--gpu-types", "a1;id:4"], "--gpu-types must be TYPE:COUNT"),
        (["restart"], "unknown command 'restart'"),
    ],
)
def test_bad_arguments_give_one_clear_line(args: list[str], message: str) -> None:
    proc = cluster_sh(*args, timeout=10)
    assert proc.returncode != 0
    assert proc.stderr.strip() == f"cluster.sh: {message}" or message in proc.stderr


# cluster.sh's first port per version (version_settings: BASE); instance K adds 100 K.
PORT_BASE = {"22.05": 17000, "24.11": 18000, "26.05": 19000}


@pytest.mark.parametrize(
    ("offset", "daemon"), [(0, "slurmctld (instance 7)"), (1, "slurmd n1 (instance 7)")]
)
def test_failed_daemon_is_named_with_its_log(
    slurm_cluster: SlurmCluster, offset: int, daemon: str
) -> None:
    """A port of instance 7 is taken: the error names the daemon and shows why, quickly."""
    port = PORT_BASE[slurm_cluster.version] + 700 + offset
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        blocker.bind(("127.0.0.1", port))
    except OSError:
        pytest.skip(f"port {port} (instance 7) is in use")
    blocker.listen()
    t0 = time.monotonic()
    try:
        proc = cluster_sh("up", "--instance", "7", "--nodes", "1", CLUSTER_WAIT_S="20")
    finally:
        elapsed = time.monotonic() - t0
        blocker.close()
        cluster_sh("down", "--instance", "7")
    assert proc.returncode == 1
    assert f"cluster.sh: {daemon} " in proc.stderr
    assert "Address already in use" in proc.stderr
    assert elapsed < 15, "a dead daemon must fail the bring-up without waiting the full timeout"


def run_dir(version: str, instance: int) -> Path:
    """cluster.sh's RUN_DIR: the pid files of one instance (version_settings, instance_paths)."""
    roots = Path(os.environ.get("SLURM_ELASTIC_ROOTS", "/var/lib/slurm-elastic/roots"))
    prefix = Path("/") if version == "22.05" else roots / version
    return prefix / "run" / "slurm-cluster" / f"i{instance}"


def test_a_stale_pid_file_is_not_believed(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A pid file left by a machine that stopped without `down` names a pid that another
    process may hold now: `status` must not call the daemon up, `down` must not signal it.
    The same file, written after that process started, is believed (the check can fail)."""
    pidfile = run_dir(slurm_cluster.version, 7) / "slurmctld.pid"
    if "slurmctld              DOWN" not in cluster_sh("status", "--instance", "7").stdout:
        pytest.skip("instance 7 is in use")
    # A process whose name is the daemon's: only the file's age tells them apart.
    fake = tmp_path / "slurmctld"
    fake.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(fake), "300"])
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    try:
        time.sleep(0.1)
        pidfile.write_text(f"{proc.pid}\n")
        hour_ago = time.time() - 3600
        os.utime(pidfile, (hour_ago, hour_ago))
        status = cluster_sh("status", "--instance", "7", timeout=30)
        assert "slurmctld              DOWN" in status.stdout, status.stdout
        cluster_sh("down", "--instance", "7")
        assert proc.poll() is None, "down signalled a process a stale pid file named"

        pidfile.write_text(f"{proc.pid}\n")  # now newer than the process: believed
        status = cluster_sh("status", "--instance", "7", timeout=30)
        assert f"slurmctld              up    pid {proc.pid}" in status.stdout, status.stdout
        cluster_sh("down", "--instance", "7")
        assert proc.wait(timeout=15) == -15, "down stops the daemon its pid file names"
    finally:
        proc.kill()
        proc.wait()
        pidfile.unlink(missing_ok=True)
