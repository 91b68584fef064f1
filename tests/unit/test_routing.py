"""Routing and splitting on the real parameter names of transformers' Qwen3-MoE and DeepSeek-V3 (tiny configs,
built locally) and on Megatron-style names."""

from __future__ import annotations

import pytest
import torch

from optim.configs import RoutingConfig
from optim.functional.split import RowSplit
from optim.routing import SplitLayout, classify, route_parameters
from tests.unit._optim_fixtures import one_thread, tiny_deepseek_v3, tiny_qwen3_moe  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")


def _by_name(routes):  # type: ignore[no-untyped-def]
    return {r.name: r for r in routes}


def test_qwen3_moe_hf_names() -> None:
    """Localises a wrong rule for embeddings, lm_head, norms, router or 3-D expert stacks on real HF names."""
    model = tiny_qwen3_moe()
    routes = _by_name(route_parameters(model.named_parameters(), naming="hf"))
    assert len(routes) == len(list(model.parameters()))
    expect = {
        "model.embed_tokens.weight": ("embedding", "adamw"),
        "lm_head.weight": ("output", "adamw"),
        "model.norm.weight": ("norm", "adamw"),
        "model.layers.0.self_attn.q_norm.weight": ("norm", "adamw"),
        "model.layers.0.self_attn.q_proj.weight": ("matrix", "matrix"),
        "model.layers.0.self_attn.k_proj.weight": ("matrix", "matrix"),
        "model.layers.0.mlp.gate_proj.weight": ("matrix", "matrix"),
        "model.layers.1.mlp.gate.weight": ("router", "matrix"),
        "model.layers.1.mlp.experts.gate_up_proj": ("expert_stack", "matrix"),
        "model.layers.1.mlp.experts.down_proj": ("expert_stack", "matrix"),
    }
    for name, (kind, opt) in expect.items():
        assert (routes[name].kind, routes[name].optimizer) == (kind, opt), name
    assert all(r.split is None for r in routes.values())  # HF q/k/v are separate; gate/up split is opt-in
    assert not routes["model.norm.weight"].decay and routes["model.embed_tokens.weight"].decay
    no_router = _by_name(
        route_parameters(model.named_parameters(), routing=RoutingConfig(router_to_matrix=False))
    )
    assert no_router["model.layers.1.mlp.gate.weight"].optimizer == "adamw"


def test_deepseek_v3_hf_names_and_splits() -> None:
    """MLA kv_a_proj_with_mqa splits into latent + rope rows; experts.gate_up_proj into [gate; up] per expert."""
    model = tiny_deepseek_v3()
    layout = SplitLayout.from_hf_config(model.config)
    routing = RoutingConfig(split_mla_kv_down=True, split_gate_up=True)
    routes = _by_name(route_parameters(model.named_parameters(), naming="hf", routing=routing, layout=layout))
    kv = routes["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"]
    assert kv.split == RowSplit(num_groups=1, sizes=(16, 4), labels=("latent", "rope"))
    gu = routes["model.layers.1.mlp.experts.gate_up_proj"]
    assert gu.kind == "expert_stack" and gu.split is not None and gu.split.sizes == (16, 16)
    for name in ("q_a_proj", "q_b_proj", "kv_b_proj", "o_proj"):
        r = routes[f"model.layers.1.self_attn.{name}.weight"]
        assert (r.kind, r.split) == ("matrix", None)
    assert routes["model.layers.1.self_attn.kv_a_layernorm.weight"].kind == "norm"
    assert routes["model.layers.1.mlp.shared_experts.gate_proj.weight"].kind == "matrix"
    assert routes["model.layers.1.mlp.gate.weight"].kind == "router"
    # the split is what the model computes: rows [:16] feed kv_a_layernorm (latent), rows [16:] are k_pe
    w = model.model.layers[0].self_attn.kv_a_proj_with_mqa.weight
    latent, rope = kv.split.split(w)
    assert (
        latent.shape == (16, 32) and rope.shape == (4, 32) and torch.equal(kv.split.merge([latent, rope]), w)
    )


MEGATRON = {
    "embedding.word_embeddings.weight": (128, 32),
    "decoder.layers.0.input_layernorm.weight": (32,),
    "decoder.layers.0.self_attention.linear_qkv.weight": (64, 32),  # 4 heads, 2 groups, d = 8: (4 + 2*2) * 8
    "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight": (32,),
    "decoder.layers.0.self_attention.linear_qkv.bias": (64,),
    "decoder.layers.0.self_attention.q_layernorm.weight": (8,),
    "decoder.layers.0.self_attention.linear_proj.weight": (32, 32),
    "decoder.layers.0.mlp.linear_fc1.weight": (128, 32),
    "decoder.layers.0.mlp.linear_fc1.layer_norm_weight": (32,),
    "decoder.layers.0.mlp.linear_fc2.weight": (32, 64),
    "decoder.layers.1.self_attention.linear_q_down_proj.weight": (24, 32),
    "decoder.layers.1.self_attention.linear_q_up_proj.weight": (48, 24),
    "decoder.layers.1.self_attention.linear_q_up_proj.layer_norm_weight": (24,),
    "decoder.layers.1.self_attention.linear_kv_down_proj.weight": (20, 32),
    "decoder.layers.1.self_attention.linear_kv_up_proj.weight": (64, 16),
    "decoder.layers.1.mlp.router.weight": (4, 32),
    "decoder.layers.1.mlp.experts.linear_fc1.weight0": (32, 32),
    "decoder.layers.1.mlp.experts.linear_fc1.weight1": (32, 32),
    "decoder.layers.1.mlp.experts.linear_fc2.weight0": (32, 16),
    "decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight": (32, 32),
    "decoder.layers.1.mlp.shared_experts.linear_fc1.weight": (32, 32),
    "decoder.layers.1.mlp.shared_experts.gate_weight": (1, 32),
    "decoder.final_layernorm.weight": (32,),
    "output_layer.weight": (128, 32),
}
LAYOUT = SplitLayout(
    num_attention_heads=4, num_query_groups=2, kv_channels=8, kv_lora_rank=16, qk_pos_emb_head_dim=4
)


def _megatron_params() -> list[tuple[str, torch.Tensor]]:
    return [(n, torch.zeros(s, requires_grad=True)) for n, s in MEGATRON.items()]


def test_megatron_names() -> None:
    routes = _by_name(route_parameters(_megatron_params(), naming="megatron", layout=LAYOUT))
    kinds = {n: r.kind for n, r in routes.items()}
    assert kinds["embedding.word_embeddings.weight"] == "embedding"
    assert kinds["output_layer.weight"] == "output"
    assert kinds["decoder.layers.1.mlp.router.weight"] == "router"
    assert kinds["decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"] == "norm"
    assert kinds["decoder.layers.0.self_attention.linear_qkv.bias"] == "bias"
    assert kinds["decoder.layers.1.mlp.shared_experts.gate_weight"] == "vector"
    matrix = {n for n, r in routes.items() if r.optimizer == "matrix"}
    assert matrix == {
        n
        for n, s in MEGATRON.items()
        if len(s) == 2 and min(s) > 1 and "embedding" not in n and "output_layer" not in n
    }
    qkv = routes["decoder.layers.0.self_attention.linear_qkv.weight"].split
    assert qkv == RowSplit(num_groups=2, sizes=(16, 8, 8), labels=("q", "k", "v"))
    assert all(r.split is None for n, r in routes.items() if "linear_qkv" not in n)  # MCore defaults


def test_megatron_optional_splits() -> None:
    routing = RoutingConfig(split_mla_kv_down=True, split_gate_up=True, split_qkv=False)
    routes = _by_name(route_parameters(_megatron_params(), naming="megatron", routing=routing, layout=LAYOUT))
    assert routes["decoder.layers.0.self_attention.linear_qkv.weight"].split is None
    assert routes["decoder.layers.1.self_attention.linear_kv_down_proj.weight"].split.sizes == (16, 4)  # type: ignore[union-attr]
    for n in (
        "decoder.layers.0.mlp.linear_fc1.weight",
        "decoder.layers.1.mlp.experts.linear_fc1.weight1",
        "decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight",
        "decoder.layers.1.mlp.shared_experts.linear_fc1.weight",
    ):
        split = routes[n].split
        assert split is not None and split.labels == ("gate", "up") and split.rows == MEGATRON[n][0], n
    assert routes["decoder.layers.0.mlp.linear_fc2.weight"].split is None


def test_qkv_split_follows_megatron_interleave() -> None:
    """Rows are [q_g0 (2 heads), k_g0, v_g0, q_g1, k_g1, v_g1]; Q must gather both groups' q rows, etc."""
    split = RowSplit(num_groups=2, sizes=(16, 8, 8), labels=("q", "k", "v"))
    tag = torch.tensor([[g * 10 + b] for g in range(2) for b, s in enumerate((16, 8, 8)) for _ in range(s)])
    w = tag.float().expand(64, 5).clone()
    q, k, v = split.split(w)
    assert set(q[:, 0].tolist()) == {0.0, 10.0} and set(k[:, 0].tolist()) == {1.0, 11.0}
    assert set(v[:, 0].tolist()) == {2.0, 12.0} and q.shape == (32, 5) and k.shape == (16, 5)
    assert torch.equal(split.merge([q, k, v]), w)
    stack = torch.randn(3, 64, 5)  # leading expert dim kept
    assert torch.equal(split.merge(split.split(stack)), stack)


def test_split_errors() -> None:
    """Missing or inconsistent layout values fail loudly, naming the parameter."""
    with pytest.raises(ValueError, match="needs SplitLayout fields"):
        route_parameters(_megatron_params(), naming="megatron")
    bad = SplitLayout(num_attention_heads=4, num_query_groups=2, kv_channels=4)
    with pytest.raises(ValueError, match="linear_qkv.weight: 64 rows"):
        route_parameters(_megatron_params(), naming="megatron", layout=bad)
    with pytest.raises(ValueError, match="naming='nemo'"):
        classify("a.weight", (2, 2), "nemo")  # type: ignore[arg-type]
    llama = type("C", (), {"model_type": "llama", "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 64})
    assert SplitLayout.from_hf_config(llama()) == SplitLayout(num_attention_heads=8, num_query_groups=2, kv_channels=8)
