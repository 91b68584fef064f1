"""The Bridge ConfigContainer of a model read from a user's Hugging Face config (`model=hf:<spec>`, engine=bridge).

Bridge's own `AutoBridge` turns the `config.json` into its model provider, exactly as its recipes do for the models
they ship (`AutoBridge.from_hf_pretrained(...).to_megatron_provider(load_weights=False)`), so the architecture
details (norms, biases, rotary settings, router) are Bridge's reading of the config, not ours. The container around
it is Bridge's common pre-training template (`megatron.bridge.recipes.common._pretrain_common`, the base of every
recipe); the product's plan (`recipes.overrides.build_plan`) then sets the shapes of `model` (a slice keeps
the architecture and changes the sizes), the parallel layout, the optimizer and the benchmark policy on top.

Families whose published recipe the product carries (Qwen3-MoE, Kimi K2 / DeepSeek-V3: `recipes.models`) keep that
recipe and its published performance settings.
"""

from __future__ import annotations

from typing import Any

from muonbench.families import FAMILIES
from muonbench.schema import ModelConfig

PROVIDERS: dict[str, str] = {
    "gqa": "megatron.bridge.models.gpt_provider:GPTModelProvider",
    "mla": "megatron.bridge.models.mla_provider:MLAModelProvider",
}
"""`ModelConfig.attention` -> the provider base class AutoBridge returns for it (the offline field check)."""

TEMPLATE = "megatron.bridge.recipes.common:_pretrain_common"
"""Bridge's pre-training template every recipe of 0.6.2 starts from (model left None)."""


def hf_spec(model: ModelConfig) -> str:
    """The `<spec>` of a model read with `model=hf:<spec>`, '' for a model of `conf/model`."""
    return model.source.removeprefix("hf:") if model.source.startswith("hf:") else ""


def check_bridged(model: ModelConfig) -> None:
    """Raise ValueError (naming `model`, its family and the bridged ones) unless Bridge has a bridge for it (a
    family outside the table was read through AutoBridge itself: `model_fields`)."""
    bridged = [name for name, fam in FAMILIES.items() if fam.bridged]
    if model.family in FAMILIES and model.family not in bridged:
        raise ValueError(
            f"model.family={model.family!r} ({model.source or model.name}): Megatron-Bridge 0.6.2 has no bridge for "
            f"it (engine=bridge); allowed {sorted(bridged)}. Use engine=megatron or engine=hf"
        )


def provider_of(model: ModelConfig) -> Any:
    """Bridge's model provider of `model`'s Hugging Face config (AutoBridge, no weights: random initialisation).

    `mtp_num_layers` is cleared: no engine builds multi-token prediction (muonbench/hf_model.py).

    Raises:
        ValueError: the model was not read from a Hugging Face config, or Bridge has no bridge for its family.
    """
    spec = hf_spec(model)
    if not spec:
        raise ValueError(f"model={model.name!r}: not read from a Hugging Face config (model=hf:<spec>)")
    check_bridged(model)
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge

    from muonbench.families import read

    config = read(spec, trust_remote_code=model.trust_remote_code, any_type=True)
    provider = AutoBridge.from_hf_config(config).to_megatron_provider(load_weights=False)
    provider.mtp_num_layers = None
    if getattr(provider, "kv_channels", 0) is None and model.kv_channels:
        provider.kv_channels = model.kv_channels  # Qwen2: Megatron would derive the same at finalize
    return provider


ACTIVATIONS = {"silu": "silu", "fast_gelu": "gelu_tanh", "gelu_tanh": "gelu_tanh", "quick_gelu": "silu"}
"""Megatron's `activation_func` name -> `ModelConfig.activation` (gpt-oss's clamped `quick_gelu` is its SwiGLU
variant, a family feature)."""

ALTERNATING_WINDOW = ("Gemma2ModelProvider",)
"""Providers that slide on odd layers in their own attention (gemma2_provider.py) instead of through
`window_attn_skip_freq`."""


def provider_fields(provider: Any) -> dict[str, Any]:
    """The architecture fields of `ModelConfig` as Bridge's provider holds them (AutoBridge's reading of a
    config.json): what `muonbench.families` reads without Bridge, for the tests that both agree and for the
    architectures the family table does not list. Sizes of the benchmark (seq_length) are not the provider's."""
    p = provider
    mla = bool(getattr(p, "multi_latent_attention", False))
    freq = p.moe_layer_freq if p.num_moe_experts else 1
    dense = next((i for i, f in enumerate(freq) if f), len(freq)) if isinstance(freq, list) else 0
    if isinstance(freq, list) and any(not f for f in freq[dense:]):
        raise ValueError(f"moe_layer_freq={freq}: only leading dense layers are represented")
    window = getattr(p, "window_size", None)
    skip = getattr(p, "window_attn_skip_freq", None) or (2 if type(p).__name__ in ALTERNATING_WINDOW else 0)
    if getattr(p, "rope_scaling", False):
        rope = {"rope_scaling_type": "llama3", "rope_scaling_factor": float(p.rope_scaling_factor),
                "rope_original_max_position_embeddings": 8192}  # fmt: skip  (Megatron's fixed llama3 context)
    elif mla and getattr(p, "rope_type", "") == "yarn":
        rope = {"rope_scaling_type": "yarn", "rope_scaling_factor": float(p.rotary_scaling_factor),
                "rope_original_max_position_embeddings": int(p.original_max_position_embeddings)}  # fmt: skip
    elif getattr(p, "position_embedding_type", "") == "yarn":
        rope = {"rope_scaling_type": "yarn", "rope_scaling_factor": float(p.yarn_rotary_scaling_factor),
                "rope_original_max_position_embeddings": int(p.yarn_original_max_position_embeddings)}  # fmt: skip
    else:
        rope = {"rope_scaling_factor": 1.0}
    out: dict[str, Any] = {
        "num_layers": p.num_layers,
        "hidden_size": p.hidden_size,
        "num_attention_heads": p.num_attention_heads,
        "attention": "mla" if mla else "gqa",
        "vocab_size": p.vocab_size,
        "make_vocab_size_divisible_by": p.make_vocab_size_divisible_by,
        "ffn_hidden_size": p.ffn_hidden_size,
        "num_experts": p.num_moe_experts or 0,
        "num_dense_layers": dense,
        "qkv_bias": bool(p.add_qkv_bias or p.add_bias_linear),
        "norm_eps": float(p.layernorm_epsilon),
        "rotary_base": float(p.rotary_base),
        "tie_embeddings": bool(p.share_embeddings_and_output_weights),
        "gated_linear_unit": bool(p.gated_linear_unit),
        "activation": ACTIVATIONS[p.activation_func.__name__],
        "sliding_window": window[0] + window[1] + 1 if window else 0,
        "window_attn_skip_freq": skip if window else 0,
        **rope,
    }
    if mla:
        out |= {"q_lora_rank": p.q_lora_rank or 0, "kv_lora_rank": p.kv_lora_rank, "qk_head_dim": p.qk_head_dim,
                "qk_pos_emb_head_dim": p.qk_pos_emb_head_dim, "v_head_dim": p.v_head_dim}  # fmt: skip
    else:
        out |= {"num_query_groups": p.num_query_groups or p.num_attention_heads, "qk_layernorm": bool(p.qk_layernorm),
                "kv_channels": p.kv_channels or p.hidden_size // p.num_attention_heads}  # fmt: skip
    if p.num_moe_experts:
        out |= {
            "moe_router_topk": p.moe_router_topk,
            "moe_ffn_hidden_size": p.moe_ffn_hidden_size,
            "moe_shared_expert_intermediate_size": p.moe_shared_expert_intermediate_size or 0,
            "moe_router_score_function": p.moe_router_score_function,
            "moe_router_pre_softmax": bool(p.moe_router_pre_softmax),
            "moe_router_enable_expert_bias": bool(p.moe_router_enable_expert_bias),
            "moe_router_topk_scaling_factor": float(p.moe_router_topk_scaling_factor or 1.0),
        }
    return out


def bridge_importable() -> bool:
    """Megatron-Bridge is imported already, or imports here: it needs Transformer Engine (a GPU node or its
    container; on a login node without it nothing is tried, which would cost seconds to fail)."""
    import importlib.util
    import sys

    if "megatron.bridge" in sys.modules:
        return True
    if importlib.util.find_spec("transformer_engine") is None or importlib.util.find_spec("megatron.bridge") is None:
        return False
    try:
        import megatron.bridge  # noqa: F401
    except ImportError:
        return False
    return True


def model_fields(spec: str, *, trust_remote_code: bool = False) -> dict[str, Any]:
    """The `ModelConfig` fields of a config.json whose model_type the family table does not list, read from the
    provider AutoBridge builds of it (`muonbench.families.model_fields` calls this where Bridge imports). Such a
    model runs on engine=bridge only (`muonbench.engines`).

    Raises:
        HFConfigError: AutoBridge maps no bridge to it, or its provider holds what ModelConfig cannot represent.
    """
    from muonbench.families import model_types, read
    from muonbench.hf_model import SEQ_LENGTH, HFConfigError

    if not bridge_importable():
        read(spec, trust_remote_code=trust_remote_code)  # the table's refusal, naming the model_type
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge

    cfg = read(spec, trust_remote_code=trust_remote_code, any_type=True)
    known = sorted(model_types())
    if not AutoBridge.supports(cfg):
        raise HFConfigError(
            f"model_type={cfg.model_type!r}: neither in the family table ({known}) nor mapped by Megatron-Bridge's "
            "AutoBridge"
        )
    provider = AutoBridge.from_hf_config(cfg).to_megatron_provider(load_weights=False)
    try:
        fields = provider_fields(provider)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise HFConfigError(
            f"model_type={cfg.model_type!r}: AutoBridge's provider holds a setting ModelConfig cannot represent "
            f"({type(exc).__name__}: {exc}); supported without it: {known}"
        ) from exc
    context = getattr(cfg, "max_position_embeddings", None) or SEQ_LENGTH
    return {**fields, "family": cfg.model_type, "seq_length": min(SEQ_LENGTH, context)}


def pretrain_config(model: ModelConfig) -> Any:
    """A Bridge ConfigContainer training `model` from scratch: Bridge's template with AutoBridge's provider.

    The product's overrides (shapes, layout, optimizer, benchmark policy) are applied by the caller
    (`recipes.bridge.make_config_container`).
    """
    import importlib

    module, _, name = TEMPLATE.partition(":")
    cfg = getattr(importlib.import_module(module), name)()
    cfg.model = provider_of(model)
    return cfg
