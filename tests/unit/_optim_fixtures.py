"""Fixtures and tiny models shared by the optim tests (test_ns, test_muon, test_mop, test_soap, test_routing,
test_hybrid)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny GEMMs: extra intra-op threads only add contention on a shared 2-core runner (measured 10-50x)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_qwen3_moe() -> Any:
    """transformers Qwen3MoeForCausalLM: 2 layers (0 dense, 1 MoE with 4 experts), GQA 4 heads / 2 groups."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        mlp_only_layers=[0],
        max_position_embeddings=64,
    )
    return Qwen3MoeForCausalLM(cfg)


def tiny_deepseek_v3() -> Any:
    """transformers DeepseekV3ForCausalLM: 2 layers (0 dense, 1 MoE + shared expert), MLA with q_lora."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        q_lora_rank=24,
        kv_lora_rank=16,
        qk_rope_head_dim=4,
        qk_nope_head_dim=8,
        v_head_dim=8,
        max_position_embeddings=64,
    )
    return DeepseekV3ForCausalLM(cfg)
