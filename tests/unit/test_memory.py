"""Predicted peak memory (bench.memory) against the committed GPU runs, and the checks that use it before launch."""

import json

import pytest

from bench import memory
from bench.tools import project
from bench.tools.perfmodel import memfit
from bench.tools.perfmodel.calibration import GPU_RUNS, load_runs
from bench.tools.perfmodel.h200 import _typed
from muonbench import load


def test_predicted_peak_within_15_percent_of_every_committed_gpu_run():
    """Localises a memory model that bounds instead of predicting: every engine's committed runs, each predicted
    within 15% of its measured peak, and within 15% when its own run is left out of the fit."""
    runs = [r for r in load_runs(GPU_RUNS) if (r.get("summary") or {}).get("peak_mem_bytes")]
    assert {r["config"]["engine"]["name"] for r in runs} == {"megatron", "bridge"} and len(runs) > 100
    for rec in runs:
        pred = memory.predict(_typed(rec["config"]))
        assert pred is not None
        err = pred["total"] / rec["summary"]["peak_mem_bytes"] - 1.0
        assert abs(err) <= 0.15, (rec["run"], err)
    doc = memfit.fit()
    for engine, e in doc["engines"].items():
        lo, hi = e["loo_rel_error"]
        assert -0.15 <= lo <= hi <= 0.15, engine


def test_the_shipped_memory_fit_is_the_fit_of_the_shipped_runs():
    """Localises a stale memory_fit.json (runs re-extracted, features changed, the fit not rerun)."""
    shipped = json.loads(memory.FIT.read_text())["engines"]
    for engine, e in memfit.fit()["engines"].items():
        assert shipped[engine]["coefficients"] == pytest.approx(e["coefficients"], rel=1e-6), engine
        assert shipped[engine]["num_runs"] == e["num_runs"]


def test_project_reports_the_peak_and_whether_it_fits():
    """The H200 FLOP-matched Bridge slice started on an H100 died out of memory after building for minutes."""
    h100 = project.project(["hardware=h100", "experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu"])
    h200 = project.project(["experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu"])
    assert h100["fits"] is False and h200["fits"] is True
    assert h100["peak_memory_gb"] == pytest.approx(h200["peak_memory_gb"]) and 80 < h100["peak_memory_gb"] < 120
    assert "predicted peak" in h100["peak_memory_basis"] and "does not fit" in project.format_text(h100)


def test_gpu_found_at_launch_is_checked_by_group_and_free_memory():
    """Localises a run that builds for minutes on a GPU too small for it, and an H200 config on an H100 unnoticed."""
    cfg = load(["experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu"])
    assert memory.matches_gpu("h200", "NVIDIA H200") and memory.matches_gpu("h100", "NVIDIA H100 80GB HBM3")
    assert not memory.matches_gpu("b200", "NVIDIA GB200") and not memory.matches_gpu("h200", "NVIDIA H100 PCIe")
    memory.check_gpu(cfg, "NVIDIA H200", 140e9)  # fits, same group: silent
    with pytest.warns(UserWarning, match=r"hardware='h200' but this GPU is 'NVIDIA H100 80GB HBM3'"):
        memory.check_gpu(cfg, "NVIDIA H100 80GB HBM3", 140e9)
    with pytest.raises(ValueError, match=r"^model=qwen3_30b_a3b_slice: needs .*\(free on this NVIDIA H200\)"):
        memory.check_gpu(cfg, "NVIDIA H200", 79e9)
    oversize = load(["experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu", "bench.allow_oversize=true"])
    with pytest.warns(UserWarning, match="predicted peak"):
        memory.check_gpu(oversize, "NVIDIA H200", 10e9)
