"""The hf engine on one CUDA GPU: bf16 autocast, CUDA-event timing, NS timed and counted (skipped without CUDA)."""

from __future__ import annotations

import pytest

import muonbench
from bench import flops
from bench.engines import RankInfo, engine_class

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_hf_engine_steps_on_cuda(optimizer):
    cfg = muonbench.load(
        [
            "model=qwen3_moe_tiny",
            "parallelism=single_gpu",
            "parallelism.gbs=4",
            "parallelism.mbs=2",
            "engine=hf",
            "engine.device=cuda",
            "engine.backend=nccl",
            "hardware=h200",
            f"optimizer={optimizer}",
            "bench.steps=3",
            "bench.warmup_steps=1",
        ]
    )
    eng = engine_class("hf")()
    eng.setup(cfg, RankInfo(rank=0, world_size=1, local_rank=0))
    try:
        metrics = [eng.step() for _ in range(3)]
        info = eng.describe()
    finally:
        eng.teardown()
    m = metrics[-1]
    assert eng.timer == "cuda_events" and info["math_dtype"].startswith("bf16")
    assert m.step_s >= m.fwd_bwd_s > 0 and m.peak_mem_bytes > 0 and m.loss == m.loss
    if optimizer == "muon":
        mats = flops.enumerate_ns_matrices(cfg.model, split_qkv=True)
        assert m.ns_s > 0 and m.ns_flops == pytest.approx(flops.ns_flops_per_step(mats, 5, "plain"))
    else:
        assert m.ns_s is None
