"""Build a transformers causal LM of any supported family (`model.family`, transformers' model_type) from our
`ModelConfig`, through `AutoModelForCausalLM.from_config`.

The model gets a tiny random init (transformers' own `_init_weights`, std 0.02) under a fixed seed, so two runs with
the same seed start from the same weights. The vocabulary is padded the way Megatron pads it
(`make_vocab_size_divisible_by`), so the FLOPs formula of `bench/flops.py` matches the built model.
"""

from __future__ import annotations

from typing import Any

from muonbench.schema import ModelConfig


def padded_vocab_size(model: ModelConfig) -> int:
    """Megatron's padded vocabulary: the next multiple of `make_vocab_size_divisible_by`."""
    div = max(1, model.make_vocab_size_divisible_by)
    return -(-model.vocab_size // div) * div


def _rope(model: ModelConfig) -> dict[str, Any]:
    if model.rope_scaling_factor == 1.0:
        return {"rope_type": "default", "rope_theta": model.rotary_base}
    return {
        "rope_type": "yarn",
        "rope_theta": model.rotary_base,
        "factor": model.rope_scaling_factor,
        "original_max_position_embeddings": model.rope_original_max_position_embeddings,
    }


def hf_config(model: ModelConfig) -> Any:
    """The transformers config equivalent to `model` (the config class of `model.family`)."""
    common = {
        "vocab_size": padded_vocab_size(model),
        "hidden_size": model.hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_attention_heads,
        "max_position_embeddings": max(
            model.seq_length, int(model.rope_original_max_position_embeddings * model.rope_scaling_factor)
        ),
        "rms_norm_eps": model.norm_eps,
        "tie_word_embeddings": model.tie_embeddings,
        "rope_parameters": _rope(model),
        "use_cache": False,
        "attention_bias": False,
    }
    gqa = {
        "num_key_value_heads": model.num_query_groups,
        "head_dim": model.kv_channels,
        "intermediate_size": model.ffn_hidden_size,
    }
    match model.family:
        case "llama" | "mistral" | "qwen3":
            if model.num_experts:
                raise ValueError(f"model.num_experts={model.num_experts}: {model.family} is dense; allowed: 0")
            return _auto(model.family, common, gqa, mlp_bias=False, sliding_window=None)
        case "qwen2":
            if model.num_experts:
                raise ValueError(f"model.num_experts={model.num_experts}: qwen2 is dense; allowed: 0")
            return _auto("qwen2", {**common, "attention_bias": True}, gqa, use_sliding_window=False)
        case "mixtral" | "olmoe":
            if model.num_dense_layers:
                raise ValueError(
                    f"model.num_dense_layers={model.num_dense_layers}: transformers' {model.family} has no dense "
                    "layers; allowed: 0"
                )
            routed = {
                **gqa,
                "intermediate_size": model.moe_ffn_hidden_size,
                "num_experts_per_tok": model.moe_router_topk,
                "router_aux_loss_coef": model.moe_aux_loss_coeff,
                "output_router_logits": model.moe_aux_loss_coeff > 0,
            }
            if model.family == "mixtral":
                return _auto("mixtral", common, routed, num_local_experts=model.num_experts, sliding_window=None)
            return _auto(
                "olmoe",
                common,
                routed,
                num_experts=model.num_experts,
                norm_topk_prob=not model.moe_router_pre_softmax,
            )
        case "qwen3_moe":
            from transformers import Qwen3MoeConfig

            if model.moe_router_score_function != "softmax":
                raise ValueError(
                    f"model.moe_router_score_function={model.moe_router_score_function!r}: "
                    "transformers' Qwen3-MoE routes with softmax; allowed: ['softmax']"
                )
            if model.moe_shared_expert_intermediate_size:
                raise ValueError(
                    f"model.moe_shared_expert_intermediate_size={model.moe_shared_expert_intermediate_size}: "
                    "transformers' Qwen3-MoE has no shared expert; allowed: 0"
                )
            return Qwen3MoeConfig(
                **common,
                num_key_value_heads=model.num_query_groups,
                head_dim=model.kv_channels,
                intermediate_size=model.ffn_hidden_size or model.moe_ffn_hidden_size,
                moe_intermediate_size=model.moe_ffn_hidden_size,
                num_experts=model.num_experts,
                num_experts_per_tok=model.moe_router_topk,
                mlp_only_layers=list(range(model.num_dense_layers)),
                decoder_sparse_step=1,
                norm_topk_prob=not model.moe_router_pre_softmax,
                router_aux_loss_coef=model.moe_aux_loss_coeff,
                output_router_logits=model.moe_aux_loss_coeff > 0,
            )
        case "deepseek_v3":
            from transformers import DeepseekV3Config

            if model.moe_router_score_function != "sigmoid":
                raise ValueError(
                    f"model.moe_router_score_function={model.moe_router_score_function!r}: "
                    "transformers' DeepSeek-V3 routes with sigmoid; allowed: ['sigmoid']"
                )
            if model.moe_shared_expert_intermediate_size not in (0, model.moe_ffn_hidden_size):
                raise ValueError(
                    f"model.moe_shared_expert_intermediate_size={model.moe_shared_expert_intermediate_size}: "
                    f"DeepSeek-V3 shared experts have the expert size; allowed: [0, {model.moe_ffn_hidden_size}]"
                )

            return DeepseekV3Config(
                **common,
                num_key_value_heads=model.num_attention_heads,
                intermediate_size=model.ffn_hidden_size,
                moe_intermediate_size=model.moe_ffn_hidden_size,
                n_routed_experts=model.num_experts,
                n_shared_experts=1 if model.moe_shared_expert_intermediate_size else 0,
                num_experts_per_tok=model.moe_router_topk,
                n_group=1,
                topk_group=1,
                first_k_dense_replace=model.num_dense_layers,
                q_lora_rank=model.q_lora_rank or None,
                kv_lora_rank=model.kv_lora_rank,
                qk_nope_head_dim=model.qk_head_dim,
                qk_rope_head_dim=model.qk_pos_emb_head_dim,
                v_head_dim=model.v_head_dim,
                routed_scaling_factor=model.moe_router_topk_scaling_factor,
                rope_interleave=True,
            )
        case other:
            raise ValueError(f"model.family={other!r}: the hf engine supports {list(HF_FAMILIES)}")




HF_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "olmoe", "deepseek_v3")
"""`model.family` values `hf_config` builds (transformers' model_type)."""


def _auto(model_type: str, common: dict[str, Any], shapes: dict[str, Any], **family: Any) -> Any:
    """transformers' config class of `model_type`, built from our values."""
    from transformers import AutoConfig

    kw = {**common, **shapes, **family}
    kw.setdefault("attention_bias", False)
    return AutoConfig.for_model(model_type, **kw)


def build_model(model: ModelConfig, *, seed: int, dtype: Any = None) -> Any:
    """A randomly initialised causal LM of `model.family` (train mode): `AutoModelForCausalLM.from_config`."""
    import torch
    from transformers import AutoModelForCausalLM

    config = hf_config(model)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    net = AutoModelForCausalLM.from_config(config)
    if dtype is not None:
        net = net.to(dtype=dtype)
    net.train()
    return net
