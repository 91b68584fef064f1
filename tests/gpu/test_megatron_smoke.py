"""Megatron engine on one GPU: a 10-step smoke run per optimizer, and ours vs Megatron's built-in Muon on one step.

Marked `gpu`; skipped without CUDA or without megatron-core. Uses the tiny Qwen3-MoE proxy (2 layers, 8 experts).
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (Megatron-core models run on CUDA only)", allow_module_level=True)
pytest.importorskip("megatron.core")

TINY = [
    "model=qwen3_moe_tiny", "parallelism=single_gpu", "parallelism.gbs=4", "parallelism.mbs=2", "engine=megatron",
    "hardware=h200", "precision=bf16",
]


def _engine(overrides: list[str]):
    from bench import config
    from bench.engines.base import RankInfo
    from bench.engines.megatron import MegatronEngine

    cfg = config.load(TINY + overrides)
    eng = MegatronEngine()
    eng.setup(cfg, RankInfo(rank=0, world_size=1, local_rank=0))
    return eng


@pytest.mark.parametrize(
    "opt", [["optimizer=adamw"], ["optimizer=muon"], ["optimizer=muon_megatron"]], ids=["adamw", "ours", "megatron"]
)
def test_ten_step_smoke(opt):
    """Ten full steps: finite loss and timings, NS time only for Muon, parameters actually move."""
    eng = _engine(opt)
    try:
        before = {n: p.detach().float().clone() for n, p in eng.model_chunks[0].named_parameters()}
        rows = [eng.step() for _ in range(10)]
        after = dict(eng.model_chunks[0].named_parameters())
        moved = sum(not torch.equal(before[n], after[n].detach().float()) for n in before)
        assert moved == len(before), f"{len(before) - moved} parameters did not change"
        for m in rows:
            assert math.isfinite(m.loss) and m.step_s > 0 and m.fwd_bwd_s > 0 and m.optim_s > 0
            assert m.step_s >= m.fwd_bwd_s
        if opt == ["optimizer=adamw"]:
            assert all(m.ns_flops == 0 for m in rows)
        else:
            assert all(m.ns_flops > 0 and m.ns_s > 0 for m in rows)
        assert eng.describe()["core_attention"] in ("sdpa", "te")
    finally:
        eng.teardown()


def test_first_update_ours_matches_megatron_builtin():
    """Same init, same batch, one step: our Muon's matrix updates equal TensorParallelMuon's (bf16 NS tolerance)."""
    deltas = {}
    for impl in ("muon", "muon_megatron"):
        eng = _engine([f"optimizer={impl}"])
        try:
            before = {n: p.detach().float().clone() for n, p in eng.model_chunks[0].named_parameters()}
            eng.step()
            deltas[impl] = {
                n: p.detach().float() - before[n] for n, p in eng.model_chunks[0].named_parameters() if p.ndim == 2
            }
        finally:
            eng.teardown()
    ours, ref = deltas["muon"], deltas["muon_megatron"]
    assert ours.keys() == ref.keys()
    for name in ours:
        if "embedding" in name or "output_layer" in name:
            continue
        cos = torch.nn.functional.cosine_similarity(ours[name].flatten(), ref[name].flatten(), dim=0)
        assert cos > 0.98, (name, float(cos))
        ratio = ours[name].norm() / ref[name].norm()
        assert 0.95 < ratio < 1.05, (name, float(ratio))
