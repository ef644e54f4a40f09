"""scripts/bench_traces.py on one small trace: its last line and its rows.json agree."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from scripts import bench_traces

EXPECTED = {
    "budget",
    "limit",
    "traces",
    "mip_over_greedy_jct_max",
    "mip_over_greedy_jct_median",
    "mip_over_static_jct_max",
    "worst_trace",
    "mip_over_greedy_jct_pollux_w1",
}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert bench_traces.main(list(argv)) == 0
    return capsys.readouterr().out.strip().splitlines()


def test_one_pollux_workload_gives_positive_finite_ratios(
    shared_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = shared_dir / "traces"
    lines = run(capsys, "--traces", str(traces), "--only", "pollux_w1", "--limit", "40",
                "--out", str(tmp_path))  # fmt: skip
    figures = dict(item.split("=", 1) for item in lines[-1].split())
    assert set(figures) == EXPECTED
    assert figures["traces"] == "1" and figures["limit"] == "40"
    assert figures["worst_trace"] == "pollux_w1"
    for key in EXPECTED - {"budget", "limit", "traces", "worst_trace"}:
        value = float(figures[key])
        assert math.isfinite(value) and value > 0, (key, value)
    # One trace: its ratio is the maximum and the median.
    ratio = figures["mip_over_greedy_jct_pollux_w1"]
    assert figures["mip_over_greedy_jct_max"] == figures["mip_over_greedy_jct_median"] == ratio
    # The printed row and rows.json carry the same simulation.
    (row,) = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert row["jobs"] == 40 and row["policies"]["mip"]["jobs_finished"] == 40
    p = row["policies"]
    assert f"{p['mip']['avg_jct_s'] / p['greedy']['avg_jct_s']:.3f}" == ratio
    assert (
        f"{p['mip']['avg_jct_s'] / p['static']['avg_jct_s']:.3f}"
        == (figures["mip_over_static_jct_max"])
    )
    assert any(line.startswith("pollux_w1 ") for line in lines)


def test_a_trace_it_cannot_read_is_skipped_aloud(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "traces" / bench_traces.TRACES["pollux_w2"]
    bad.parent.mkdir(parents=True)
    bad.write_text("who,what\n1,2\n")
    lines = run(capsys, "--traces", str(tmp_path / "traces"), "--only", "pollux_w1",
                "--only", "pollux_w2", "--out", str(tmp_path / "out"))  # fmt: skip
    assert any(line.startswith("skip pollux_w1 ") and "No such file" in line for line in lines)
    assert any(line.startswith("skip pollux_w2 ") and "unrecognised" in line for line in lines)
    assert lines[-1] == "budget=mix traces=0"
    assert json.loads((tmp_path / "out" / "rows.json").read_text())["skipped"].keys() == {
        "pollux_w1",
        "pollux_w2",
    }


def test_key_names_keep_only_lower_case_digits_and_underscores() -> None:
    assert bench_traces.key_name("Pollux-Realistic w1.csv") == "pollux_realistic_w1_csv"
