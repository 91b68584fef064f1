"""Prediction intervals (bench.tools.perfmodel.intervals): out-of-sample errors of the committed GPU runs, and the
assumption spread of hardware rows without runs."""

import pytest

from bench.tools import project
from bench.tools.perfmodel import intervals


@pytest.fixture(scope="module")
def rows():
    return intervals.run_errors()


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
