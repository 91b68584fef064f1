"""Our `ModelConfig` as a Hugging Face `config.json`: the inverse of `muonbench.hf_model`, built only here.

`muonbench.families.config_json(model)` returns the plain dict of the family's transformers config: `common` plus
the family's exporter below (legacy `rope_theta` / `rope_scaling` keys, which transformers 4 and 5 both read). The
hf engine builds its model from it (`bench.models.hf_build`, vocabulary padded the way Megatron pads it), and the
Bridge recipes write it into an offline Hub cache (`recipes.hf_config`, adding the published values `ModelConfig` does not hold).
"""

from __future__ import annotations

from typing import Any

from muonbench.schema import ModelConfig


def _require(field: str, value: Any, allowed: list[Any], why: str) -> None:
    if value not in allowed:
        raise ValueError(f"model.{field}={value!r}: {why}; allowed: {allowed}")


def common(model: ModelConfig, architecture: str, vocab_size: int) -> dict[str, Any]:
    """The keys every family's config shares; `architecture` is the family's causal-LM class."""
    common: dict[str, Any] = {
        "model_type": model.family,
        "architectures": [architecture],
        "vocab_size": vocab_size,
        "hidden_size": model.hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_attention_heads,
        "max_position_embeddings": max(
            model.seq_length, int(model.rope_original_max_position_embeddings * model.rope_scaling_factor)
        ),
        "rms_norm_eps": model.norm_eps,
        "tie_word_embeddings": model.tie_embeddings,
        "rope_theta": model.rotary_base,
        "hidden_act": "silu",
        "use_cache": False,
        "attention_bias": False,
        # no tokenizer here: a family's default token ids can lie outside a slice's vocabulary (transformers warns)
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }
    if model.rope_scaling_factor != 1.0:
        common["rope_scaling"] = {
            "type": "yarn",
            "rope_type": "yarn",
            "factor": model.rope_scaling_factor,
            "original_max_position_embeddings": model.rope_original_max_position_embeddings,
        }
    return common


def _gqa(model: ModelConfig) -> dict[str, Any]:
    return {
        "num_key_value_heads": model.num_query_groups,
        "head_dim": model.kv_channels,
        "intermediate_size": model.ffn_hidden_size,
    }


def dense(model: ModelConfig) -> dict[str, Any]:
    """Llama, Mistral, Qwen3: GQA, no biases."""
    _require("num_experts", model.num_experts, [0], f"{model.family} is dense")
    return {**_gqa(model), "mlp_bias": False, "sliding_window": None}


def qwen2(model: ModelConfig) -> dict[str, Any]:
    """Qwen2: GQA with q/k/v biases."""
    _require("num_experts", model.num_experts, [0], f"{model.family} is dense")
    return {**_gqa(model), "attention_bias": True, "use_sliding_window": False}


def routed(model: ModelConfig) -> dict[str, Any]:
    """Mixtral and OLMoE: every layer routed, no shared expert."""
    _require(
        "num_dense_layers", model.num_dense_layers, [0], f"transformers' {model.family} has no dense layers"
    )
    shapes = {
        **_gqa(model),
        "intermediate_size": model.moe_ffn_hidden_size,
        "num_experts_per_tok": model.moe_router_topk,
        "router_aux_loss_coef": model.moe_aux_loss_coeff,
        "output_router_logits": model.moe_aux_loss_coeff > 0,
    }
    if model.family == "mixtral":
        return {**shapes, "num_local_experts": model.num_experts, "sliding_window": None}
    return {**shapes, "num_experts": model.num_experts, "norm_topk_prob": not model.moe_router_pre_softmax}


def qwen3_moe(model: ModelConfig) -> dict[str, Any]:
    _require(
        "moe_router_score_function",
        model.moe_router_score_function,
        ["softmax"],
        "transformers' Qwen3-MoE routes with softmax",
    )
    _require(
        "moe_shared_expert_intermediate_size",
        model.moe_shared_expert_intermediate_size,
        [0],
        "transformers' Qwen3-MoE has no shared expert",
    )
    return {
        **_gqa(model),
        "intermediate_size": model.ffn_hidden_size or model.moe_ffn_hidden_size,
        "moe_intermediate_size": model.moe_ffn_hidden_size,
        "num_experts": model.num_experts,
        "num_experts_per_tok": model.moe_router_topk,
        "mlp_only_layers": list(range(model.num_dense_layers)),
        "decoder_sparse_step": 1,
        "norm_topk_prob": not model.moe_router_pre_softmax,
        "router_aux_loss_coef": model.moe_aux_loss_coeff,
        "output_router_logits": model.moe_aux_loss_coeff > 0,
    }


def deepseek_v3(model: ModelConfig) -> dict[str, Any]:
    _require(
        "moe_router_score_function",
        model.moe_router_score_function,
        ["sigmoid"],
        "transformers' DeepSeek-V3 routes with sigmoid",
    )
    _require(
        "moe_shared_expert_intermediate_size",
        model.moe_shared_expert_intermediate_size,
        [0, model.moe_ffn_hidden_size],
        "DeepSeek-V3 shared experts have the expert size",
    )
    return {
        "num_key_value_heads": model.num_attention_heads,
        "intermediate_size": model.ffn_hidden_size,
        "moe_intermediate_size": model.moe_ffn_hidden_size,
        "n_routed_experts": model.num_experts,
        "n_shared_experts": 1 if model.moe_shared_expert_intermediate_size else 0,
        "num_experts_per_tok": model.moe_router_topk,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": model.moe_router_score_function,
        "norm_topk_prob": True,
        "moe_layer_freq": 1,
        "first_k_dense_replace": model.num_dense_layers,
        "q_lora_rank": model.q_lora_rank or None,
        "kv_lora_rank": model.kv_lora_rank,
        "qk_nope_head_dim": model.qk_head_dim,
        "qk_rope_head_dim": model.qk_pos_emb_head_dim,
        "v_head_dim": model.v_head_dim,
        "routed_scaling_factor": model.moe_router_topk_scaling_factor,
        "rope_interleave": True,
    }
