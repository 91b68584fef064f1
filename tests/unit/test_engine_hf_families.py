"""The hf engine builds a tiny slice of every family `model=hf:` reads (AutoModelForCausalLM.from_config, random
init) and steps Muon on it: NS counted over exactly the matrices bench.flops enumerates."""

from __future__ import annotations

from pathlib import Path

import pytest

import muonbench
from bench import flops
from bench.engines import RankInfo, engine_class

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
SLICE = (
    "model.num_layers=2",
    "model.hidden_size=64",
    "model.num_attention_heads=4",
    "model.vocab_size=512",
    "model.seq_length=32",
    "model.ffn_hidden_size=96",
)
GQA = ("model.num_query_groups=2", "model.kv_channels=16")
MOE = ("model.num_experts=4", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=32")
MLA = (
    "model.q_lora_rank=32",
    "model.kv_lora_rank=16",
    "model.qk_head_dim=16",
    "model.qk_pos_emb_head_dim=8",
    "model.v_head_dim=16",
    "model.num_dense_layers=1",
    "model.moe_shared_expert_intermediate_size=32",
)
FAMILIES = {
    "llama3_8b": ("LlamaForCausalLM", GQA),
    "qwen2_5_7b": ("Qwen2ForCausalLM", GQA),
    "qwen3_8b": ("Qwen3ForCausalLM", GQA),
    "qwen3_30b_a3b": ("Qwen3MoeForCausalLM", GQA + MOE),
    "mixtral_8x7b": ("MixtralForCausalLM", GQA + MOE),
    "olmoe_1b_7b": ("OlmoeForCausalLM", GQA + MOE),
    "deepseek_v3": ("DeepseekV3ForCausalLM", MOE + MLA),
}


def tiny(name: str, *extra: str) -> muonbench.schema.RootConfig:
    return muonbench.load(
        [
            f"model=hf:{FIXTURES / name}",
            *SLICE,
            *FAMILIES[name][1],
            "parallelism=single_gpu",
            "parallelism.gbs=2",
    "parallelism.mbs=2",
            "engine=hf",
            "hardware=cpu",
            "bench.steps=2",
            "bench.warmup_steps=1",
            *extra,
        ]
    )


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_slice_builds_and_steps_muon(name: str) -> None:
    import torch

    torch.set_num_threads(1)
    cfg = tiny(name, "optimizer=muon")
    eng = engine_class("hf")()
    eng.setup(cfg, RankInfo(rank=0, world_size=1, local_rank=0))
    try:
        m, info = eng.step(), eng.describe()
        hidden = {p.shape[-1] for n, p in eng.model.named_parameters() if n.endswith("embed_tokens.weight")}
    finally:
        eng.teardown()
    assert info["model_class"] == FAMILIES[name][0] and hidden == {64}
    assert (info.get("routes") or {}).get("matrix/expert_stack", 0) == (2 if cfg.model.num_experts else 0) * (
        cfg.model.num_layers - cfg.model.num_dense_layers
    )
    assert m.loss > 0 and m.ns_s > 0
    # transformers: q, k, v and a dense (or shared-expert) FFN's gate and up are separate Linear layers; the routed
    # experts' gate and up are one fused stack.
    split = flops.enumerate_ns_matrices(cfg.model, split_qkv=True, split_gate_up=True)
    fused = flops.enumerate_ns_matrices(cfg.model, split_qkv=True, split_gate_up=False)
    mats = [x for x in split if not x.expert] + [x for x in fused if x.expert]
    assert m.ns_flops == pytest.approx(flops.ns_flops_per_step(mats, cfg.optimizer.num_ns_steps, "plain"))
