"""experiments.step_profile.step_profile: phase ranges are captured by torch.profiler, and the summary splits kernel time per phase."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from experiments.step_profile import step_profile as sp


def test_phase_ranges_are_captured_on_cpu(tmp_path):
    def step():
        with sp.phase_range("fwd_bwd"):
            x = torch.randn(64, 64)
            y = x @ x
        with sp.phase_range("optim"):
            y.add_(1.0)
        return float(y.sum())

    out, prof = sp.profile_step(step, cuda=False)
    assert isinstance(out, float)
    summary = sp.summarize(prof.events(), {"fwd_bwd": 0.5, "optim": 0.1})
    assert set(summary["phases"]) == {"fwd_bwd", "optim"}
    # no CUDA here: no kernel time, the whole wall time is host-side gap
    assert summary["phases"]["fwd_bwd"]["kernel_s"] == 0.0
    assert summary["phases"]["fwd_bwd"]["gap_s"] == 0.5
    path = sp.write(tmp_path, 7, summary)
    assert (
        path.name == "profile_step7.json" and json.loads(path.read_text())["phases"]["optim"]["wall_s"] == 0.1
    )
    assert "fwd_bwd: kernels 0.000 s, wall 0.500 s" in sp.main_table(summary)


def _ev(name, dev, t_us):
    return SimpleNamespace(name=name, device_type=dev, device_time_total=t_us)


def test_summary_splits_kernel_time_per_phase_and_ranks_kernels():
    events = [
        _ev("muonbench/fwd_bwd", "DeviceType.CPU", 3_000_000.0),  # kernels launched inside: 3 s
        _ev("muonbench/optim", "DeviceType.CPU", 200_000.0),
        _ev("sm90_xmma_gemm_bf16", "DeviceType.CUDA", 1_000_000.0),
        _ev("sm90_xmma_gemm_bf16", "DeviceType.CUDA", 1_500_000.0),
        _ev("elementwise_kernel", "DeviceType.CUDA", 700_000.0),
        _ev("aten::mm", "DeviceType.CPU", 5.0),
        _ev("muonbench/fwd_bwd", "DeviceType.CUDA", 3_240_000.0),  # GPU-side annotation of the range
    ]
    s = sp.summarize(events, {"fwd_bwd": 3.25, "optim": 0.2})
    assert s["phases"]["fwd_bwd"]["kernel_s"] == 3.0
    assert s["phases"]["fwd_bwd"]["gpu_span_s"] == 3.24
    assert abs(s["phases"]["fwd_bwd"]["gap_s"] - 0.25) < 1e-12
    assert abs(s["phases"]["optim"]["gap_s"]) < 1e-12
    assert s["kernel_total_s"] == 3.2
    assert s["top_kernels"][0] == {"name": "sm90_xmma_gemm_bf16", "calls": 2, "total_ms": 2500.0}
    assert [k["name"] for k in s["top_kernels"]] == ["sm90_xmma_gemm_bf16", "elementwise_kernel"]
    # a phase without a wall time from the engine has no gap
    assert sp.summarize(events)["phases"]["optim"]["gap_s"] is None


def _tev(name, dev, start, end):
    return SimpleNamespace(
        name=name,
        device_type=dev,
        device_time_total=end - start,
        time_range=SimpleNamespace(start=start, end=end),
    )


def test_timeline_splits_busy_and_idle_per_phase_window():
    cuda = "DeviceType.CUDA"
    events = [
        _tev("muonbench/fwd_bwd", cuda, 0.0, 1000.0),
        _tev("muonbench/optim", cuda, 1000.0, 1300.0),
        _tev("gemm", cuda, 5.0, 400.0),  # 5 us idle before it
        _tev("gemm", cuda, 350.0, 500.0),  # overlaps the first: busy counts the union
        _tev("elementwise", cuda, 500.0, 560.0),  # starts at 500: no gap
        _tev("gemm", cuda, 620.0, 990.0),  # 60 us gap before, 10 us idle at the window's end
        _tev("ns_kernel", cuda, 1100.0, 1300.0),  # 100 us gap at the optim window's start
        _tev("aten::mm", "DeviceType.CPU", 0.0, 2000.0),  # host op: ignored
    ]
    t = sp.timeline(events)
    fb = t["fwd_bwd"]
    assert abs(fb["busy_s"] - 925e-6) < 1e-12 and abs(fb["idle_s"] - 75e-6) < 1e-12
    # 5 us before the first kernel; 60 us mid-window and 10 us at the window's end are in the 10-100 us class
    assert abs(fb["idle_by_gap_s"]["lt_10us"] - 5e-6) < 1e-12
    assert abs(fb["idle_by_gap_s"]["lt_100us"] - 70e-6) < 1e-12
    assert fb["largest_gaps"][0] == {"us": 60.0, "after": "elementwise", "before": "gemm"}
    assert fb["largest_gaps"][1] == {"us": 10.0, "after": "gemm", "before": "<phase end>"}
    assert fb["top_kernels"][0]["name"] == "gemm" and fb["top_kernels"][0]["calls"] == 3
    opt = t["optim"]
    assert opt["idle_s"] == 100e-6 and opt["idle_by_gap_s"]["lt_1ms"] == 100e-6
    assert (
        opt["largest_gaps"][0]["before"] == "ns_kernel" and opt["largest_gaps"][0]["after"] == "<phase start>"
    )
    # CPU-only captures (no device events) have no timeline
    assert sp.timeline([_tev("muonbench/fwd_bwd", "DeviceType.CPU", 0.0, 1.0)]) == {}


def test_timeline_counts_a_window_annotated_on_two_streams_once():
    """Localises a doubled window (7.9 s for a 4 s forward-backward on the H200): torch.profiler annotated the range
    on two streams with overlapping spans; busy and idle time come from their union."""
    cuda = "DeviceType.CUDA"
    events = [
        _tev("muonbench/fwd_bwd", cuda, 0.0, 1000.0),
        _tev("muonbench/fwd_bwd", cuda, 10.0, 990.0),
        _tev("gemm", cuda, 100.0, 900.0),
    ]
    fb = sp.timeline(events)["fwd_bwd"]
    assert (
        fb["window_s"] == 1000e-6
        and abs(fb["busy_s"] - 800e-6) < 1e-12
        and abs(fb["idle_s"] - 200e-6) < 1e-12
    )
    assert fb["top_kernels"][0]["calls"] == 1


def test_probe_profiles_the_last_warmup_step_into_the_run_dir(tmp_path):
    """The probe starts torch.profiler before its step and writes profile_step<k>.json after it (CPU: the CUDA
    activity is simply empty); other steps are untouched."""
    import json
    from types import SimpleNamespace

    from bench.timing import phase_range
    from experiments.step_profile import probe as probe_mod

    cfg = SimpleNamespace(bench=SimpleNamespace(steps=4, warmup_steps=2))
    engine = SimpleNamespace(cfg=cfg, run_dir=str(tmp_path), last_phases={})
    p = probe_mod.Probe()
    p.setup(engine)
    assert p.step == 1
    for _ in range(cfg.bench.steps):
        p.before_step()
        with phase_range("fwd_bwd"):
            sum(range(1000))
        with phase_range("optim"):
            sum(range(1000))
        engine.last_phases = {"step": 0.002, "fwd_bwd": 0.001, "optim": 0.001}
        assert p.after_step() == {}
    assert [f.name for f in tmp_path.iterdir()] == ["profile_step1.json"]
    summary = json.loads((tmp_path / "profile_step1.json").read_text())
    assert summary["step_s"] == 0.002 and {"fwd_bwd", "optim"} <= set(summary["phases"])
    with pytest.raises(ValueError, match="step=9"):
        probe_mod.Probe(step="9").setup(engine)
