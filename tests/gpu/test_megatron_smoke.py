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
    "model=qwen3_moe_tiny",
    "parallelism=single_gpu",
    "parallelism.gbs=4",
    "parallelism.mbs=2",
    "engine=megatron",
    "hardware=h200",
    "precision=bf16",
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
    "opt",
    [["optimizer=adamw"], ["optimizer=muon"], ["optimizer=muon_megatron"]],
    ids=["adamw", "ours", "megatron"],
)
def test_ten_step_smoke(opt):
    """Ten full steps: finite loss and timings, NS time only for Muon, parameters actually move."""
    eng = _engine(opt)
    try:
        # 2-D weights only: a 3e-4 step on a norm weight of 1.0 is below bf16 resolution (ulp 7.8e-3).
        before = {
            n: p.detach().float().clone() for n, p in eng.model_chunks[0].named_parameters() if p.ndim == 2
        }
        rows = [eng.step() for _ in range(10)]
        after = dict(eng.model_chunks[0].named_parameters())
        frozen = [n for n in before if torch.equal(before[n], after[n].detach().float())]
        assert not frozen, f"weights that did not change: {frozen}"
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
                n: p.detach().float() - before[n]
                for n, p in eng.model_chunks[0].named_parameters()
                if p.ndim == 2
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


def test_grouped_mm_experts_cuda_matches_loop():
    """The grouped-GEMM path equals a per-expert F.linear loop (bf16 tolerance), uneven and empty groups included."""
    from types import SimpleNamespace

    from bench.engines.megatron_experts import _swiglu

    cfg = SimpleNamespace(
        expert_tensor_parallel_size=1,
        gated_linear_unit=True,
        add_bias_linear=False,
        moe_ffn_hidden_size=64,
        hidden_size=128,
        expert_model_parallel_size=1,
        use_cpu_initialization=False,
        params_dtype=torch.bfloat16,
        init_method=lambda w: torch.nn.init.normal_(w, std=0.02),
        output_layer_init_method=lambda w: torch.nn.init.normal_(w, std=0.02),
    )
    mod = _plain_grouped(cfg)
    counts = torch.tensor([5, 0, 17, 9])
    x = torch.randn(int(counts.sum()), 128, device="cuda", dtype=torch.bfloat16)
    probs = torch.rand(int(counts.sum()), device="cuda")
    out, _ = mod(x, counts, probs)
    ref = []
    for xe, pe, a, b in zip(
        x.split(counts.tolist()),
        probs.split(counts.tolist()),
        mod.linear_fc1.weights(),
        mod.linear_fc2.weights(),
    ):
        ref.append(torch.nn.functional.linear(_swiglu(torch.nn.functional.linear(xe, a), pe), b))
    torch.testing.assert_close(out, torch.cat(ref), rtol=2e-2, atol=2e-3)


def _plain_grouped(cfg):
    """GroupedMMExperts without MegatronModule's config checks (a plain namespace config)."""
    from bench.engines.megatron_experts import GroupedMMExperts, _ExpertWeights

    mod = GroupedMMExperts.__new__(GroupedMMExperts)
    torch.nn.Module.__init__(mod)
    mod.num_local_experts = 4
    common = {"allreduce": True, "dtype": torch.bfloat16, "device": "cuda"}
    mod.linear_fc1 = _ExpertWeights(4, 128, 128, partition_dim=0, init_method=cfg.init_method, **common)
    mod.linear_fc2 = _ExpertWeights(
        4, 128, 64, partition_dim=1, init_method=cfg.output_layer_init_method, **common
    )
    return mod


def test_ours_checkpoint_round_trip():
    """Save ours (Megatron-wrapped Muon + AdamW) after 2 steps, restore into a fresh engine, replay step 3."""
    import copy

    eng = _engine(["optimizer=muon"])
    try:
        eng.step()
        eng.step()
        state = copy.deepcopy(eng.optimizer.state_dict())
        params = {n: p.detach().clone() for n, p in eng.model_chunks[0].named_parameters()}
        eng.step()
        want = {n: p.detach().clone() for n, p in eng.model_chunks[0].named_parameters()}
    finally:
        eng.teardown()
    eng = _engine(["optimizer=muon"])
    try:
        with torch.no_grad():
            for n, p in eng.model_chunks[0].named_parameters():
                p.copy_(params[n])
        eng.optimizer.load_state_dict(state)
        for _ in range(2 * eng.num_microbatches):  # the same micro-batches as the first engine's step 3
            next(eng.data)
        eng.step()
        # Flash-attention and grouped-GEMM backward are not bitwise deterministic: compare the step-3 updates.
        for n, p in eng.model_chunks[0].named_parameters():
            if p.ndim != 2:
                continue
            got, ref = (
                (p.detach().float() - params[n].float()).flatten(),
                (want[n].float() - params[n].float()).flatten(),
            )
            assert torch.nn.functional.cosine_similarity(got, ref, dim=0) > 0.99, n
    finally:
        eng.teardown()
