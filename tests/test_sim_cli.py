"""``slurm-elastic simulate`` end to end on a small slice of a real trace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_elastic.cli import cli
from slurm_elastic.sim.metrics import FIELDS


@pytest.fixture(scope="module")
def cluster06(shared_dir: Path) -> Path:
    return shared_dir / "traces" / "itp_elasticflow" / "augmented" / "cluster06.csv"


def test_simulate_writes_results_and_plots(cluster06: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["simulate", "--trace", str(cluster06), "--limit", "40", "--nodes", "16"]
    args += ["--policies", "static,mip", "--seed", "3", "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "results.json").read_text())
    assert set(doc) == {"policies", "trace", "config"}
    assert list(doc["policies"]) == ["static", "mip"]
    for figures in doc["policies"].values():
        assert tuple(figures) == FIELDS
        assert figures["jobs_finished"] == 40
    assert doc["policies"]["static"]["resizes"] == 0
    assert doc["config"]["nodes"] == 16 and doc["config"]["workload"]["seed"] == 3
    assert doc["trace"]["format"] == "itp-augmented"
    for name in ("jct_cdf.png", "utilization.png", "queue.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for word in ("avg_jct_s", "static", "mip", "gpu_hours"):
        assert word in result.output


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--policies", "static,best"], "unknown policy 'best'"),
        (["--from-sacct", "2024-01-01", "2023-01-01"], "give exactly one of"),
        (["--elastic-fraction", "2"], "elastic-fraction"),
        (["--partitions", "gpu:0"], "is not NAME:NODES"),
        (["--partitions", "a:2,a:3"], "must name distinct partitions"),
    ],
)
def test_bad_input_is_one_line(
    cluster06: Path, tmp_path: Path, extra: list[str], needle: str
) -> None:
    args = ["simulate", "--trace", str(cluster06), "--out", str(tmp_path), *extra]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0
    assert needle in result.output
    assert "Traceback" not in result.output


def test_bad_trace_file(tmp_path: Path) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text("a,b\n1,2\n")
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(bad), "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.startswith("Error: unrecognised trace header")


def test_sacct_window_must_be_ordered(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["simulate", "--from-sacct", "2024-02-01", "2024-01-01", "--out", str(tmp_path)]
    )
    assert result.exit_code == 1
    assert "END 2024-01-01 is not after START 2024-02-01" in result.output


def test_help_does_not_import_the_solver_stack() -> None:
    code = (
        "import sys; from click.testing import CliRunner; from slurm_elastic.cli import cli;"
        "r = CliRunner().invoke(cli, ['simulate', '--help']); assert r.exit_code == 0, r.output;"
        "heavy = ('torch', 'scipy', 'highspy', 'matplotlib', 'slurm_elastic.daemon.controller');"
        "bad = [m for m in heavy if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_simulate_with_named_partitions(cluster06: Path, tmp_path: Path) -> None:
    args = ["simulate", "--trace", str(cluster06), "--limit", "20", "--partitions", "gpu:12,dbg:4"]
    args += ["--policies", "greedy", "--out", str(tmp_path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["config"]["partitions"] == {"gpu": 12, "dbg": 4}
    assert doc["config"]["nodes"] == 16
    assert doc["policies"]["greedy"]["jobs_finished"] == 20
