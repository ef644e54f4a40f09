"""The validation bench's own definitions (scripts/bench_models.py) on tiny fabricated files."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from slurm_elastic.model.convergence import FAMILIES

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_models", REPO / "scripts/bench_models.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_models"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_truth_epoch_is_the_models_window_criterion_on_the_smoothed_curve(bench) -> None:
    # Smoothed: [9, 8, 6, 4, 2.67, 2, 2, ...]; l_first = 8.5.  Epoch 10 (window 5 back to
    # epoch 5): gain 2.67 - 2 = 0.67 > 0.065; epoch 11: gain 0 -> converged at 11.
    metric = [10.0, 8.0, 6.0, 4.0, 2.0, 2.0] + [2.0] * 10
    assert bench.truth_epoch(metric) == (11, True)
    # Rising metrics the same way (the criterion does not depend on direction or offset).
    assert bench.truth_epoch([1.0 - m / 10.0 for m in metric]) == (11, True)
    # Never flat: counted at its last epoch, and flagged.
    assert bench.truth_epoch([float(20 - i) for i in range(12)]) == (12, False)


def test_target_truth_uses_five_percent_of_the_improvement(bench) -> None:
    # Loss from 10 to a final mean of 1: the band is 0.45, first entered at epoch 4.
    metric = [10.0, 5.0, 2.0, 1.4, 1.2, 1.0, 1.0, 1.0]
    epoch, thr = bench.target_truth(metric)
    assert epoch == 4
    assert thr == pytest.approx(1.45)
    # Rising metrics the same way.
    epoch, thr = bench.target_truth([0.1, 0.5, 0.85, 0.89, 0.9, 0.9, 0.9])
    assert epoch == 4 and thr == pytest.approx(0.86)


def test_interpolation_yardstick_is_exact_on_a_power_law(bench) -> None:
    sizes = [1, 2, 4, 8]
    rates = [3.0 * n**0.8 for n in sizes]
    assert bench.interp_baseline(sizes, rates, 16) == pytest.approx(3.0 * 16**0.8)
    assert bench.interp_baseline(sizes, rates, 3) == pytest.approx(3.0 * 3**0.8)


def test_oracle_yardstick_is_the_criterion_on_the_known_trend(bench) -> None:
    """Without noise around the trend, the yardstick's continuations are the curve itself:
    its prediction is the truth.  With noise it stays near it, and a seed fixes it."""
    curve = [1.0 + 5.0 * math.exp(-(e - 1) / 4.0) for e in range(1, 41)]
    assert bench.truth_epoch(curve) == (24, True)
    assert bench.oracle_epoch(curve, 8, seed=1, paths=20) == 24.0
    rng = np.random.default_rng(0)
    noisy = [v + float(rng.normal(0.0, 0.05)) for v in curve]
    first = bench.oracle_epoch(noisy, 8, seed=1, paths=100)
    assert first == bench.oracle_epoch(noisy, 8, seed=1, paths=100)
    assert abs(first - bench.truth_epoch(noisy)[0]) <= 5


def test_oracle_error_is_the_headlines_error(bench) -> None:
    pred = bench.Prediction(epoch=32.0, observed=False, family="exp")
    row = bench.ConvRow(
        "toy/1", 50, 27, True, 27, {0.5: 25}, {0.5: pred}, {0.5: pred}, oracle={0.5: 28.0}
    )
    assert row.oracle_err(0.5) == pytest.approx(0.5)
    assert bench.oracle_remaining([row], 0.5) == [pytest.approx(0.5)]
    # Rows without a yardstick prediction (another family's pass) are left out, not errors.
    bare = bench.ConvRow("toy/2", 50, 27, True, 27, {0.5: 25}, {0.5: pred}, {0.5: pred})
    assert bench.oracle_remaining([bare], 0.5) == []


def _write_traces(root: Path) -> None:
    prof = root / "pollux/profiles/toy"
    prof.mkdir(parents=True)
    rows = ["progress,iteration,metric,grad_sqr,grad_var"]
    for e in range(1, 21):
        rows.append(f"{e},{e * 10},{1.0 / (0.3 * e + 0.5) + 0.2},1,1")
    (prof / "validation-64.csv").write_text("\n".join(rows) + "\n")
    (prof / "validation-32.csv").write_text(rows[0] + "\n1,1,0.5,1,1\n2,2,0.4,1,1\n")
    (prof / "placements.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n1,32,0.10,0\n2,32,0.11,0.01\n"
        "4,32,0.12,0.02\n22,32,0.14,0.04\n"
    )
    (prof / "scalability.csv").write_text(
        "num_nodes,num_replicas,local_bsz,step_time,sync_time\n4,16,32,0.20,0.1\n"
    )
    ef = root / "elasticflow_throughputs"
    (ef / "A100").mkdir(parents=True)
    (ef / "T4").mkdir(parents=True)
    (ef / "A100/toy.csv").write_text("global_batch_size,1,2,4,8\n64,1.0,1.9,3.5,\n")
    gavel = {"v100": {str(("Toy (batch size 8)", s)): {"null": 2.0 * s**0.9} for s in (1, 2, 4, 8)}}
    (root / "gavel").mkdir()
    (root / "gavel/simulation_throughputs.json").write_text(json.dumps(gavel))


def test_rows_from_fabricated_traces(bench, tmp_path: Path) -> None:
    _write_traces(tmp_path)
    conv = list(bench.conv_rows(tmp_path))
    assert any(isinstance(r, str) and "toy/32: skipped" in r for r in conv)
    (row,) = [r for r in conv if not isinstance(r, str)]
    assert row.name == "toy/64" and row.epochs == 20 and row.seen == {0.25: 5, 0.5: 10}
    for frac in (0.25, 0.5):
        for mode in ("plateau", "target"):
            assert math.isfinite(row.err(frac, mode)) and row.err(frac, mode) >= 0
        assert row.plateau[frac].family in FAMILIES and row.target[frac].family in FAMILIES
    # A prediction the prefix already settles is exact: the truth is the same detection.
    for frac, pred in row.plateau.items():
        if pred.observed:
            assert pred.epoch == row.truth and not row.ahead(frac)
    tables = {name: (n, errs) for _, name, n, errs, _, _ in bench.tput_rows(tmp_path)}
    assert tables["elasticflow/A100/toy/b64"][0] == 3  # the empty cell is skipped
    assert tables["gavel/v100/Toy (batch size 8)"][0] == 4
    # Pollux: one row per replica count (1, 2, 4, 16); "4" and "22" both give 4 replicas.
    assert tables["pollux/toy/local32"][0] == 4
    for _, errs in tables.values():
        assert all(math.isfinite(e) and e >= 0 for e in errs)


def test_the_headline_scores_the_remaining_epochs_of_curves_with_a_known_stop(bench) -> None:
    """Issue 17, item 5: seen 25, true 27, predicted 32 is 0.19 of the total but 2.5 of the
    2 epochs that remained; a curve that never met the criterion has no known remainder."""
    pred = bench.Prediction(epoch=32.0, observed=False, family="exp")
    row = bench.ConvRow("toy/1", 50, 27, True, 27, {0.5: 25}, {0.5: pred}, {0.5: pred})
    assert row.err(0.5) == pytest.approx(5 / 27)
    assert row.remaining_err(0.5) == pytest.approx(2.5) and row.scored_ahead(0.5)
    never = bench.ConvRow("toy/2", 50, 50, False, 50, {0.5: 25}, {0.5: pred}, {0.5: pred})
    assert never.ahead(0.5) and not never.scored_ahead(0.5)
    behind = bench.ConvRow("toy/3", 50, 20, True, 20, {0.5: 25}, {0.5: pred}, {0.5: pred})
    assert not behind.scored_ahead(0.5)


def test_main_prints_key_value_last_line(bench, tmp_path: Path, capsys) -> None:
    _write_traces(tmp_path)
    assert bench.main(["--traces", str(tmp_path), "--jobs", "20"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    keys = dict(kv.split("=") for kv in last.split())
    for key in (
        "conv_median_err_25",
        "conv_median_err_50",
        "conv_ahead_curves_50",
        "conv_ahead_total_median_err_50",
        "tput_median_err",
        "fit_1000_jobs_s",
        "select_1000_jobs_s",
        "outlook_1000_jobs_s",
    ):
        assert math.isfinite(float(keys[key]))
    # The yardstick's keys are there (NaN here: the toy curve never meets the criterion).
    assert {"conv_ahead_oracle_median_err_25", "conv_ahead_oracle_median_err_50"} <= set(keys)


def test_main_rejects_a_missing_traces_dir(bench, tmp_path: Path, capsys) -> None:
    assert bench.main(["--traces", str(tmp_path / "nope")]) == 2
    assert "no Pollux profiles" in capsys.readouterr().err


def test_family_ablation_forces_one_family(bench, tmp_path: Path, capsys) -> None:
    _write_traces(tmp_path)
    rows = [r for r in bench.conv_rows(tmp_path, "optimus") if not isinstance(r, str)]
    assert rows and all(p.family == "optimus" for r in rows for p in r.plateau.values())
    assert bench.main(["--traces", str(tmp_path), "--jobs", "5", "--family", "power"]) == 0
    out = capsys.readouterr().out
    assert "power/power" in out
    # Every choice is compared, and the leave-one-model-out line names the one model.
    for choice in ("exp", "optimus", "power", "auto"):
        assert f"# family={choice}" in out
    assert "leave-one-model-out choice: toy->" in out


def test_no_observed_ablation_always_extrapolates(bench, tmp_path: Path) -> None:
    _write_traces(tmp_path)
    rows = [r for r in bench.conv_rows(tmp_path, observed=False) if not isinstance(r, str)]
    assert rows and not any(p.observed for r in rows for p in r.plateau.values())
