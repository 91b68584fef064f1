"""Prediction intervals (bench.tools.perfmodel.intervals): out-of-sample errors of the committed GPU runs, and the
assumption spread of hardware rows without runs."""

import pytest

from bench.tools import project
from bench.tools.perfmodel import intervals


@pytest.fixture(scope="module")
def rows():
    return intervals.run_errors(optimizer_loo=False)  # the step's errors; the optimizer's refits are slow


def test_shipped_errors_are_those_of_the_shipped_runs_and_model(rows):
    """Localises a stale prediction_errors.json (the model or the runs changed, the file not rewritten)."""
    shipped = intervals.shipped()["groups"]
    for key, g in intervals.groups(rows).items():
        assert shipped[key]["num_out_of_sample"] == g["num_out_of_sample"], key
        assert shipped[key]["oos_rel_error"] == pytest.approx(g["oos_rel_error"], abs=1e-9), key
    assert set(intervals.shipped()["assumption_sets"]) == {"b200", "gb300", "h100"}


def test_fitted_runs_are_predicted_out_of_sample_by_a_refit_without_them(rows):
    """The Bridge fit's runs are left out of the fit they predict; the Megatron fit's one run counts in-sample only;
    both engines have out-of-sample errors on H200."""
    fitted = [r for r in rows if r["in_fit"]]
    bridge = [r for r in fitted if r["engine"] == "bridge"]
    assert len(bridge) == 6 and all(r["oos_rel_error"] != r["in_sample_rel_error"] for r in bridge)
    assert [r["oos_rel_error"] for r in fitted if r["engine"] == "megatron"] == [None]
    groups = intervals.groups(rows)
    assert set(groups) == {"megatron/h200", "bridge/h200"}
    assert all(g["num_out_of_sample"] >= 20 for g in groups.values())


@pytest.mark.parametrize(
    ("overrides", "basis"),
    [
        (["experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"], "out-of-sample errors of"),
        (["experiment=gb300/qwen3_30b_a3b_muon"], "assumption sets of the gb300 row"),
        (["experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu", "hardware=h100"], "not calibrated on h100"),
    ],
)
def test_every_projection_carries_an_interval_around_it(overrides, basis):
    """Localises a prediction without error bars: JSON `step_time_s_interval` [lo, hi] beside `step_time_s`, its basis
    named, and both in the text."""
    res = project.project(overrides)
    lo, hi = res["step_time_s_interval"]
    assert lo < res["step_time_s"] < hi and basis in res["step_time_s_interval_basis"]
    assert f"interval {lo:.3f} - {hi:.3f} s" in project.format_text(res)


def test_interval_of_a_calibrated_group_spans_its_out_of_sample_errors(rows):
    """Every out-of-sample run's measured step lies inside the interval its own prediction would get."""
    from muonbench import load

    cfg = load(["experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"])
    for r in rows:
        if r["engine"] != "megatron" or r["oos_rel_error"] is None:
            continue
        lo, hi = intervals.interval(cfg, "ours", r["predicted_step_s"])["step_time_s_interval"]
        assert lo <= r["measured_step_s"] * (1 + 1e-12) and r["measured_step_s"] <= hi * (1 + 1e-12), r["run"]


def test_muon_step_term_within_15_percent_out_of_sample_where_plan_times_exist():
    """Localises the optimizer-step term missing the Muon step by -34% to +28%: built from the NS plan's measured
    kernel times (shipped seeds and the committed runs' plans) with one fitted element-wise fraction, each such run
    predicted by the fraction refitted without it; the committed constant is that fit."""
    from bench.tools.perfmodel import calibrate
    from bench.tools.perfmodel import constants as C

    runs = [r for r in intervals.shipped()["runs"] if r["optim_in_fit"]]
    assert len(runs) >= 15 and {r["engine"] for r in runs} == {"megatron", "bridge"}
    assert len({r["model"] for r in runs}) >= 4
    assert all(abs(r["optim_oos_rel_error"]) <= 0.15 for r in runs), [r["run"] for r in runs]
    fit, worst = calibrate.fit_h200_optimizer_hbm(iters=20)
    assert round(fit, 2) == C.H200_OPTIMIZER_HBM_FIT and worst <= 0.15


def test_ns_table_of_ours_takes_the_plan_times_where_measured():
    """A shape the plan measured is priced from that measurement (per matrix, the call's host cost removed)."""
    from bench.tools.perfmodel import nscost

    data = nscost.ns_data("ours")
    planned = nscost.plan_table(data.host_ms)
    plain = nscost.ns_data("ours", gram=False)
    assert (4096, 14336) in planned and plain.table[(4096, 14336)] == planned[(4096, 14336)]
    assert all(data.table[k] <= v for k, v in planned.items())  # Gram-NS, where measured faster, stays
    assert "NS plan's measured times" in data.source
    assert nscost.PLAN_SEEDS.samefile(__import__("optim.kernels.plan_seed", fromlist=["SEED_DIR"]).SEED_DIR)
