"""Both local engines build a tiny slice of every family `model=hf:` reads: the hf engine (AutoModelForCausalLM.
from_config, random init) steps Muon with NS counted over exactly the matrices bench.flops enumerates, and the
megatron engine's GPTModel holds the same weight matrices, numel for numel."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_megatron_adapter import CPU_OPTS, megatron_groups  # noqa: F401 - the fixture is used by name

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


def _matrix_numel(named) -> int:
    """Elements of the weight matrices (2-D and stacked 3-D); norms, biases and router biases are 1-D."""
    return sum(p.numel() for _, p in named if p.dim() >= 2)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_megatron_engine_builds_the_same_matrices(name: str, megatron_groups, monkeypatch) -> None:  # noqa: F811
    import torch

    from bench.engines import megatron_model as mm
    from bench.models.hf_build import build_model

    cfg = tiny(name)
    if cfg.model.attention == "mla":  # MLA's rotary embedding asks CUDA for a device (test_megatron_adapter.py)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    config = mm.transformer_config(cfg.model, cfg.parallelism, CPU_OPTS)
    spec = mm.decoder_block_spec(config, CPU_OPTS)
    gpt = mm.build_gpt_model(cfg.model, config, spec, pre_process=True, post_process=True)
    names = {n for n, _ in gpt.named_parameters()}
    assert any(n.endswith("linear_qkv.bias") for n in names) == cfg.model.qkv_bias
    assert any("q_layernorm" in n for n in names) == cfg.model.qk_layernorm
    assert config.moe_router_pre_softmax == cfg.model.moe_router_pre_softmax if cfg.model.num_experts else True
    assert _matrix_numel(gpt.named_parameters()) == _matrix_numel(build_model(cfg.model, seed=0).named_parameters())
