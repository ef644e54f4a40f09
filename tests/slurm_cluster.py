"""pytest plugin: the real local Slurm cluster (scripts/cluster.sh) as fixtures.

* ``slurm_cluster`` (session): brings up instance ``$SLURM_ELASTIC_TEST_INSTANCE`` (default
  0) of Slurm ``$SLURM_ELASTIC_SLURM`` (22.05, 24.11 or 26.05; default 22.05, the host's)
  with ``$SLURM_ELASTIC_TEST_NODES`` nodes (default 4) -- a quick no-op when it is already
  up -- applies ``cluster.sh env``'s exports (``SLURM_CONF``, and ``PATH`` with a newer
  version's clients first) to this process and yields a :class:`SlurmCluster`.
* ``clean_queue`` (function): cancels every job of that cluster and waits (bounded) until
  the queue is empty and every node is idle, then cancels again after the test.
* ``two_users`` (session): the two unprivileged users of the hostile-user tests
  (``se-alice``, ``se-bob``; ``scripts/install-deps.sh`` adds them, ``cluster.sh up`` gives
  them associations), each with ``sbatch``/``scontrol``/... run as that user.
* ``pyslurm_module`` (session): pyslurm built for the cluster's Slurm release, imported from
  ``/var/lib/slurm-elastic/pyslurm/<release>`` (``scripts/build-pyslurm.sh``) the way the
  daemon finds it (``slurm.select.find_pyslurm``).

Tests marked ``@pytest.mark.slurm`` are skipped when this machine cannot run the cluster
(not root, or Debian's Slurm is not installed) -- but only outside CI: with ``CI`` set a
missing cluster is a failure, never a skip.  The same holds for ``pyslurm_module``: no
pyslurm build for the running Slurm is a skip here and a failure in CI (``make setup``
builds it).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from scripts.cluster_env import DEFAULT_VERSION, VERSIONS, use_cluster
from slurm_elastic.demo.harness import DEFAULT_SLURM as DEMO_DEFAULT_SLURM

REPO = Path(__file__).resolve().parent.parent
CLUSTER_SH = REPO / "scripts" / "cluster.sh"
# The host's 22.05; a newer version's root is built by cluster.sh itself (debootstrap).
SLURM_BINARIES = (
    "/usr/sbin/slurmctld",
    "/usr/sbin/slurmd",
    "/usr/sbin/slurmdbd",
    "/usr/sbin/munged",
)
UP_TIMEOUT_S = 300  # a first `up` of a newer version builds its root (~45 s)
IDLE_TIMEOUT_S = 40.0


@dataclass(frozen=True)
class SlurmCluster:
    version: str  # "22.05", "24.11", "26.05"
    instance: int
    conf: Path
    cluster_name: str
    nodes: tuple[str, ...]
    partitions: tuple[str, ...]  # the default partition first

    exports: dict[str, str]  # cluster.sh env: SLURM_CONF, PATH, SLURM_ELASTIC_SLURM

    @property
    def env(self) -> dict[str, str]:
        """os.environ with this cluster's exports (for subprocesses)."""
        return {**os.environ, **self.exports}

    def run(
        self, *args: str, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        # errors="replace": job names and comments may hold non-UTF-8 bytes (as in the runner).
        return subprocess.run(
            args,
            env=self.env,
            capture_output=True,
            text=True,
            errors="replace",
            check=check,
            timeout=timeout,
        )

    def active_job_ids(self) -> list[int]:
        out = self.run("squeue", "-h", "-o", "%i|%T").stdout
        return [int(line.split("|")[0].split("_")[0]) for line in out.split() if line]

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-p", self.partitions[0], "-o", "%N|%t").stdout
        return dict(line.split("|", 1) for line in out.split())


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in {"", "0", "false", "no"}


def test_version() -> str:
    """The Slurm version the live tests run against (``$SLURM_ELASTIC_SLURM``)."""
    version = os.environ.get("SLURM_ELASTIC_SLURM") or DEFAULT_VERSION
    if version not in VERSIONS:
        raise pytest.UsageError(f"SLURM_ELASTIC_SLURM={version!r}: not one of {VERSIONS}")
    return version


def site_settings() -> dict[str, str]:
    """The extra slurm.conf settings the live tests run under (``SLURM_ELASTIC_TEST_CONF``,
    space-separated ``KEY=VALUE``; test-matrix.sh's parser leg)."""
    pairs = (line.partition("=") for line in os.environ.get("SLURM_ELASTIC_TEST_CONF", "").split())
    return {key: value for key, _, value in pairs}


def cluster_unavailable_reason() -> str | None:
    """Why this machine cannot run the local cluster, None when it can."""
    if os.geteuid() != 0:
        return "needs root (scripts/cluster.sh starts munged, MariaDB and Slurm daemons)"
    if test_version() != DEFAULT_VERSION:
        return None  # cluster.sh builds that version's root; its errors fail the fixture
    missing = [b for b in SLURM_BINARIES if not Path(b).exists()]
    if missing:
        return f"Debian's Slurm is not installed ({', '.join(missing)}): run make setup"
    return None


def _skip_or_fail(reason: str, what: str = "the local Slurm cluster") -> None:
    if in_ci():
        pytest.fail(f"CI is set but {what} is unavailable: {reason}")
    pytest.skip(reason)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("slurm") is not None:
        reason = cluster_unavailable_reason()
        if reason is not None:
            _skip_or_fail(reason)
    one = item.get_closest_marker("default_slurm_only")
    if one is not None and test_version() != DEFAULT_VERSION:
        # A test whose Slurm calls and Slurm output another live test exercises on every
        # version: the matrix's minutes go to what differs between versions
        # (docs/local-clusters.md).
        pytest.skip(f"run on Slurm {DEFAULT_VERSION} only: {one.args[0]}")
    demo = item.get_closest_marker("demo_slurm_only")
    if demo is not None and test_version() != DEMO_DEFAULT_SLURM:
        pytest.skip(f"the demo runs on its default Slurm {DEMO_DEFAULT_SLURM}: {demo.args[0]}")


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until true; fail the test saying ``what`` did not happen, with
    what Slurm was doing then (``slurm_now``)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{slurm_now()}")
        time.sleep(0.2)


def slurm_now() -> str:
    """The nodes' states and reasons and the queue with each job's reason, as text: what a
    live test's timeout prints, so a wait that ran out says whether Slurm was slow, a node
    was held back (a leak shows as allocated with no job on it) or a job was refused."""
    out = []
    for cmd in (["sinfo", "-N", "-o", "%N %T %E"], ["squeue", "-a", "-o", "%i %u %T %r %D %N"]):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
            out.append(f"$ {' '.join(cmd)}\n{done.stdout}{done.stderr}")
        except (OSError, subprocess.SubprocessError) as exc:
            out.append(f"$ {' '.join(cmd)}: {exc}")
    return "\n".join(out)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    reason = cluster_unavailable_reason()
    if reason is not None:
        _skip_or_fail(reason)
    version = test_version()
    instance = int(os.environ.get("SLURM_ELASTIC_TEST_INSTANCE", "0"))
    nodes = int(os.environ.get("SLURM_ELASTIC_TEST_NODES", "4"))
    if os.environ.get("SLURM_ELASTIC_IN_ROOT"):
        yield _cluster_from_root(version, instance, nodes)
        return
    cmd = ["bash", str(CLUSTER_SH), "up", "--slurm", version, "--instance", str(instance)]
    cmd += ["--nodes", str(nodes)]
    # A site's setting the tests run under (test-matrix.sh's parser leg), e.g.
    # SLURM_ELASTIC_TEST_CONF="DataParserParameters=v0.0.40": extra slurm.conf lines.
    for key, value in site_settings().items():
        cmd += ["--conf", f"{key}={value}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=UP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(cmd)} took more than {UP_TIMEOUT_S}s")
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    yield _local_cluster(version, instance, nodes, use_cluster(version, instance))


def _local_cluster(
    version: str, instance: int, nodes: int, exports: dict[str, str]
) -> SlurmCluster:
    """What cluster.sh made of instance ``instance`` (names from scripts/cluster/*.tmpl)."""
    return SlurmCluster(
        version=version,
        instance=instance,
        conf=Path(exports["SLURM_CONF"]),
        exports=exports,
        cluster_name=f"cluster{instance}",
        nodes=tuple(f"n{i}" for i in range(1, nodes + 1)),
        partitions=("batch", "shared"),
    )


def _cluster_from_root(version: str, instance: int, nodes: int) -> SlurmCluster:
    """Inside a version's root (``cluster.sh exec``): cluster.sh cannot run here, and the
    cluster is up with SLURM_CONF set by exec; check that it answers and use it as it is."""
    exports = {"SLURM_CONF": os.environ["SLURM_CONF"], "SLURM_ELASTIC_SLURM": version}
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    if "UP" not in ping.stdout:
        pytest.fail(f"inside the Slurm {version} root, slurmctld does not answer: {ping.stdout}")
    return _local_cluster(version, instance, nodes, exports)


def _cancel_all(cluster: SlurmCluster) -> None:
    ids = cluster.active_job_ids()
    if ids:
        cluster.run("scancel", *map(str, ids), check=False)


@pytest.fixture
def clean_queue(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    _cancel_all(slurm_cluster)

    def settled() -> bool:
        if slurm_cluster.active_job_ids():
            _cancel_all(slurm_cluster)  # a job submitted while we waited
            return False
        states = slurm_cluster.node_states()
        return len(states) == len(slurm_cluster.nodes) and set(states.values()) == {"idle"}

    try:
        wait_until(settled, IDLE_TIMEOUT_S, "an empty queue and idle nodes")
    except pytest.fail.Exception:
        states = slurm_cluster.node_states()
        jobs = slurm_cluster.active_job_ids()
        pytest.fail(f"queue not clean after {IDLE_TIMEOUT_S:.0f}s: nodes {states}, jobs {jobs}")
    yield slurm_cluster
    _cancel_all(slurm_cluster)


# Where the pyslurm backend is tested per Slurm version: no pyslurm release exists for 26.05.
PYSLURM_WHERE = {"22.05": "host", "24.11": "root"}


@pytest.fixture(scope="session")
def pyslurm_module(slurm_cluster: SlurmCluster) -> ModuleType:
    from slurm_elastic.slurm.cli import CliBackend
    from slurm_elastic.slurm.select import (
        PYSLURM_BASE,
        find_pyslurm,
        slurm_release,
        versions_match,
    )

    # Where the matrix has pyslurm (a missing build fails under CI): 22.05 on the host, and
    # 24.11 inside its root (make test's pyslurm-24.11 leg; a build for the root's libslurm
    # cannot load on the host).  26.05 has no pyslurm release.
    where = PYSLURM_WHERE.get(slurm_cluster.version)
    inside = bool(os.environ.get("SLURM_ELASTIC_IN_ROOT"))
    if where is None or where != ("root" if inside else "host"):
        pytest.skip(
            f"pyslurm for Slurm {slurm_cluster.version} is tested "
            + (f"{'inside its root' if where == 'root' else 'on the host'}" if where else "nowhere")
            + " (tests/slurm_cluster.py: PYSLURM_WHERE)"
        )
    cli = CliBackend(slurm_conf=str(slurm_cluster.conf), timeout_s=20)
    module, version, slurm_version, why = find_pyslurm(cli)
    what = f"pyslurm for Slurm {slurm_version}"
    if module is None or version is None or slurm_version is None:
        release = slurm_release(slurm_version or "") or "<major.minor>"
        _skip_or_fail(
            why
            or f"no pyslurm imports (none on sys.path, no build under {PYSLURM_BASE}): "
            f"bash scripts/build-pyslurm.sh --slurm {release}",
            what,
        )
    if not versions_match(str(version), str(slurm_version)):
        _skip_or_fail(f"pyslurm {version} ({module}) does not match Slurm {slurm_version}", what)
    return module


# The unprivileged users of the hostile-user tests (scripts/install-deps.sh adds them).
TEST_USERS = ("se-alice", "se-bob")


@dataclass(frozen=True)
class ClusterUser:
    """An unprivileged local user with a Slurm association on the test cluster."""

    name: str
    uid: int
    home: Path
    cluster: SlurmCluster

    def run(
        self, *args: str, check: bool = True, timeout: float = 30.0, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a command as this user (``runuser``, never a shell), against the cluster."""
        return subprocess.run(
            ["runuser", "-u", self.name, "--", *args],
            env={**self.cluster.env, "HOME": str(self.home), "USER": self.name},
            cwd=cwd or self.home,
            capture_output=True,
            text=True,
            errors="replace",
            check=check,
            timeout=timeout,
        )

    def sbatch(self, *args: str, cwd: Path | None = None) -> int:
        """Submit a job as this user; its id."""
        out = self.run("sbatch", "--parsable", "-o", "/dev/null", *args, cwd=cwd).stdout
        return int(out.strip().split(";")[0])


@pytest.fixture(scope="session")
def two_users(slurm_cluster: SlurmCluster) -> tuple[ClusterUser, ClusterUser]:
    users = []
    for name in TEST_USERS:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            _skip_or_fail(f"no local user {name}: run make setup (scripts/install-deps.sh)", name)
        users.append(ClusterUser(name, entry.pw_uid, Path(entry.pw_dir), slurm_cluster))
    out = slurm_cluster.run(
        "sacctmgr", "-n", "-P", "list", "assoc", f"cluster={slurm_cluster.cluster_name}",
        "format=user",
    ).stdout.split()  # fmt: skip
    missing = [u.name for u in users if u.name not in out]
    if missing:
        _skip_or_fail(f"no Slurm association for {missing}: run scripts/cluster.sh up again")
    return users[0], users[1]


@contextlib.contextmanager
def configured(
    cluster: SlurmCluster, settings: list[str], *, gpu_types: str = ""
) -> Iterator[SlurmCluster]:
    """The instance restarted with ``settings`` as extra slurm.conf lines (``cluster.sh up
    --conf``) and, when given, typed GPUs (``cluster.sh up --gpu-types``, e.g.
    ``"a100:2,t4:2"``), then restarted as the session had it: for a test of a site's setting
    (preemption, the step manager, GPU types).  Every job of the instance is cancelled
    either way.  Inside a version's root (``cluster.sh exec``) cluster.sh cannot run: skip."""
    if os.environ.get("SLURM_ELASTIC_IN_ROOT"):
        pytest.skip("cluster.sh cannot restart the instance from inside a version's root")

    def up(lines: list[str], types: str = "") -> None:
        for job in cluster.active_job_ids():
            cluster.run("scancel", str(job), check=False)
        cmd = ["bash", str(CLUSTER_SH), "up", "--slurm", cluster.version]
        cmd += ["--instance", str(cluster.instance), "--nodes", str(len(cluster.nodes))]
        for line in lines:
            cmd += ["--conf", line]
        if types:
            cmd += ["--gpu-types", types]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=UP_TIMEOUT_S)
        if proc.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")

    up(settings, gpu_types)
    try:
        yield cluster
    finally:
        up([f"{key}={value}" for key, value in site_settings().items()])
