"""`muonbench calibrate` on a GPU: it measures within its budget and writes a profile that `project` then rests on."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_calibrate_writes_a_profile_project_uses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import memory
    from bench.tools import calibrate, project
    from bench.tools.perfmodel import hwprofile

    name = torch.cuda.get_device_name(0)
    group = next((g for g in ("h100", "h200", "b200", "gb300") if memory.matches_gpu(g, name)), None)
    if group is None:
        pytest.skip(f"{name} belongs to no hardware group of conf/hardware")
    monkeypatch.setenv(hwprofile.ENV_DIR, str(tmp_path))
    hwprofile.clear()
    overrides = ["model=qwen3_moe_tiny", "parallelism=single_gpu", f"hardware={group}", "optimizer=muon"]
    start = time.perf_counter()
    assert calibrate.main([*overrides, "budget_s=30"]) == 0
    assert time.perf_counter() - start < 90
    (path,) = tmp_path.glob("*.json")
    prof = hwprofile.load(path)
    assert prof.gpu["name"] == name and prof.hardware == group
    assert 1.0 < prof.tflops["dense"] < 5000.0 and prof.hbm_gbps["copy"] > 100.0 and prof.ns_plan_ms
    res = project.project(overrides, "ours")
    assert str(path) in res["hardware_profile"]
