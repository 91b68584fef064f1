"""The gpu quality profile's code path on CUDA at toy size: bf16 grouped experts under autocast, every optimizer's
trial (CUDA-event optimizer timing, no per-step sync), token windows on the device."""

from __future__ import annotations

import math

import pytest
import torch

from bench.tools.quality import data, run, tuning

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
ARGS = ["profile=gpu", "hidden_size=128", "num_layers=2", "seq_len=64", "batch_size=8", "val_batches=2"]


def test_grouped_experts_bf16_match_fp32_on_cuda() -> None:
    """Localises a CUDA-only failure of the grouped GEMM path (layout, offsets, dtype) against the fp32 module."""
    from bench.models.hf_experts import use_autocast_grouped_experts

    cfg = run.parse_cli([*ARGS, "vocab_size=512"])
    exp = run.build_model(cfg, 512).model.layers[0].mlp.experts  # on cuda: grouped forward installed
    cpu = run.build_model(run.parse_cli([*ARGS, "vocab_size=512", "device=cpu"]), 512)  # module's own forward
    ref = cpu.model.layers[0].mlp.experts.to("cuda")
    assert use_autocast_grouped_experts(torch.nn.Sequential()) == 0
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(256, 128, device="cuda", generator=g)
    idx = torch.stack([torch.randperm(32, device="cuda", generator=g)[:4] for _ in range(256)])
    w = torch.rand(256, 4, device="cuda", generator=g)
    with torch.no_grad():
        exp.gate_up_proj.copy_(ref.gate_up_proj)
        exp.down_proj.copy_(ref.down_proj)
        want = ref(h, idx, w)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got = exp(h, idx, w)
    assert got.dtype == torch.float32
    assert (got - want).norm() / want.norm() < 2e-2


@pytest.mark.parametrize("name", ["adamw", "muon", "muon_split_gate_up", "mop", "soap_rekls"])
def test_trial_on_cuda(name: str) -> None:
    cfg = run.parse_cli([*ARGS, "steps=6", "eval_every=3", "vocab_size=512"])
    tokens = torch.randint(0, 512, (50_000,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    val = data.fixed_val_batches(tokens[-5000:], batch_size=8, seq_len=64, num_batches=2)
    hp = tuning.point(name, cfg, lr=3e-3)
    out = run.train_one(name, hp, cfg, tokens[:-5000].cuda(), val, 512, lambda _: None)
    assert out["status"] == "ok", out["status"]
    assert [p["step"] for p in out["curve"]] == [3, 6]
    assert math.isfinite(out["final_val_loss"]) and out["final_val_loss"] < math.log(512) + 0.5
    assert 0 < out["opt_step_s"] < out["wall_s"] and out["peak_mem_gib"] > 0
