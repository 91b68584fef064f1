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
        "hidden_act": HF_ACTIVATIONS[model.activation],
        "use_cache": False,
        "attention_bias": False,
        # no tokenizer here: a family's default token ids can lie outside a slice's vocabulary (transformers warns)
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }
    if model.rope_scaling_factor != 1.0:
        kind = model.rope_scaling_type
        common["rope_scaling"] = {
            "type": kind,
            "rope_type": kind,
            "factor": model.rope_scaling_factor,
            "original_max_position_embeddings": model.rope_original_max_position_embeddings,
        } | ({"low_freq_factor": 1.0, "high_freq_factor": 4.0} if kind == "llama3" else {})
    return common


HF_ACTIVATIONS = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh"}
"""`ModelConfig.activation` -> transformers' `hidden_act` (the inverse of `hf_model.ACTIVATIONS`)."""


def window(model: ModelConfig, *, layer_types: bool = False) -> dict[str, Any]:
    """The sliding window as transformers' keys: `sliding_window`, and `layer_types` for the families that list
    them (Gemma 2, gpt-oss); a family without layer types slides on every layer."""
    if not model.sliding_window:
        return {"sliding_window": None}
    freq = model.window_attn_skip_freq
    if not layer_types:
        _require("window_attn_skip_freq", freq, [0], f"transformers' {model.family} slides on every layer")
        return {"sliding_window": model.sliding_window}
    kinds = ["full_attention" if freq and (i + 1) % freq == 0 else "sliding_attention" for i in range(model.num_layers)]
    return {"sliding_window": model.sliding_window, "layer_types": kinds}


def _gqa(model: ModelConfig) -> dict[str, Any]:
    return {
        "num_key_value_heads": model.num_query_groups,
        "head_dim": model.kv_channels,
        "intermediate_size": model.ffn_hidden_size,
    }


def dense(model: ModelConfig) -> dict[str, Any]:
    """Llama, Mistral, Qwen3, Phi-3: GQA, no biases."""
    _require("num_experts", model.num_experts, [0], f"{model.family} is dense")
    return {**_gqa(model), "mlp_bias": False, **window(model)}


def gemma2(model: ModelConfig) -> dict[str, Any]:
    """Gemma 2: GQA, GeGLU, soft-capped logits, the query scaled by the head dim (`hf_model.gemma2`)."""
    _require("num_experts", model.num_experts, [0], f"{model.family} is dense")
    return {
        **_gqa(model),
        **window(model, layer_types=True),
        "hidden_activation": HF_ACTIVATIONS[model.activation],
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "query_pre_attn_scalar": model.kv_channels,
    }


def qwen2_moe(model: ModelConfig) -> dict[str, Any]:
    """Qwen2-MoE: Qwen2 attention, routed experts and one gated shared expert."""
    return {
        **qwen3_moe(model),
        "shared_expert_intermediate_size": model.moe_shared_expert_intermediate_size,
        "use_sliding_window": False,
    }


def gpt_oss(model: ModelConfig) -> dict[str, Any]:
    """gpt-oss: GQA with biases and attention sinks, every layer routed."""
    _require("num_dense_layers", model.num_dense_layers, [0], "transformers' gpt-oss has no dense layers")
    return {
        **_gqa(model),
        **window(model, layer_types=True),
        "attention_bias": True,
        "intermediate_size": model.moe_ffn_hidden_size,
        "num_local_experts": model.num_experts,
        "num_experts_per_tok": model.moe_router_topk,
        "router_aux_loss_coef": model.moe_aux_loss_coeff,
        "output_router_logits": model.moe_aux_loss_coeff > 0,
    }


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
        f"transformers' {model.family} routes with softmax",
    )
    if model.family == "qwen3_moe":
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


def deepseek_v2(model: ModelConfig) -> dict[str, Any]:
    """DeepSeek-V2: MLA, softmax routing over all experts (weights renormalised unless pre-softmax), shared
    experts counted in expert sizes."""
    _require("moe_router_score_function", model.moe_router_score_function, ["softmax"],
             "transformers' DeepSeek-V2 routes with softmax")  # fmt: skip
    shared, size = model.moe_shared_expert_intermediate_size, model.moe_ffn_hidden_size
    if size and shared % size:
        _require("moe_shared_expert_intermediate_size", shared, [size * k for k in range(1, 4)],
                 "DeepSeek-V2 shared experts have the expert size")  # fmt: skip
    out = _mla(model)
    return out | {
        "n_shared_experts": shared // size if size else 0,
        "scoring_func": "softmax",
        "topk_method": "greedy",
        "norm_topk_prob": not model.moe_router_pre_softmax,
        "rope_interleave": True,
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
    return _mla(model) | {
        "n_shared_experts": 1 if model.moe_shared_expert_intermediate_size else 0,
        "topk_method": "noaux_tc",
        "scoring_func": model.moe_router_score_function,
        "norm_topk_prob": True,
        "rope_interleave": True,
    }


def _mla(model: ModelConfig) -> dict[str, Any]:
    """The keys DeepSeek-V2 and -V3 share: MLA ranks and head dims, routed experts, leading dense layers."""
    return {
        "num_key_value_heads": model.num_attention_heads,
        "intermediate_size": model.ffn_hidden_size,
        "moe_intermediate_size": model.moe_ffn_hidden_size,
        "n_routed_experts": model.num_experts,
        "num_experts_per_tok": model.moe_router_topk,
        "n_group": 1,
        "topk_group": 1,
        "moe_layer_freq": 1,
        "first_k_dense_replace": model.num_dense_layers,
        "q_lora_rank": model.q_lora_rank or None,
        "kv_lora_rank": model.kv_lora_rank,
        "qk_nope_head_dim": model.qk_head_dim,
        "qk_rope_head_dim": model.qk_pos_emb_head_dim,
        "v_head_dim": model.v_head_dim,
        "routed_scaling_factor": model.moe_router_topk_scaling_factor,
    }
