"""Per-model base of a Megatron-Bridge recipe, as pure data (section -> field -> value).

One entry per model family: the Megatron-Bridge recipe function that builds the model provider (it reads the HF
config, so architecture details such as YaRN, router score function and expert bias come from Bridge exactly as in
the published runs), the provider class (for the offline field check), and the settings of the published GB300
perf recipes that belong to the model rather than to the GPU (MB 0.6.2 `perf_recipes/{kimi,qwen}/gb300/`).

`base_sections(model)` also writes the shape fields of our `ModelConfig`: a no-op for the real models and what
turns the Bridge recipe into a tiny proxy (`kimi_k2_tiny`, `qwen3_moe_tiny`) for a one-GPU smoke run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from muonbench.schema import ModelConfig

Sections = dict[str, dict[str, Any]]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelRecipe:
    """The Bridge pieces one model family is built from."""

    family: str
    """`ModelConfig.family` this recipe serves."""
    base_recipe: str
    """`module:function` in megatron.bridge returning the model's ConfigContainer."""
    provider: str
    """`module:Class` of `cfg.model` (the offline tests read its fields from source)."""
    published: Sections = field(default_factory=dict)
    """Model-specific settings of the published perf recipe (non-defaults against `base_recipe` only)."""


# Kimi K2, MB perf_recipes/kimi/gb300/kimi_k2.py::kimi_k2_pretrain_256gpu_gb300_fp8mx_config.
KIMI_K2 = ModelRecipe(
    family="deepseek_v3",
    base_recipe="megatron.bridge.recipes.kimi.kimi_k2:kimi_k2_pretrain_config",
    provider="megatron.bridge.models.mla_provider:MLAModelProvider",
    published={
        "model": {
            "moe_router_fusion": True,
            "recompute_granularity": "selective",
            "recompute_modules": ["mla_up_proj"],  # recompute only the MLA up-projections
            "moe_router_force_load_balancing": True,  # benchmark routing: balanced, dropless
            "qk_clip": False,
            "moe_shared_expert_overlap": False,
            "cuda_graph_scope": [],  # no CUDA graphs (cuda_graph_impl stays "none")
        },
        "dist": {"enable_megatron_core_experimental": True},
        "ddp": {"overlap_grad_reduce": True},
        "comm_overlap": {"overlap_grad_reduce": True},
        "rng": {"te_rng_tracker": True},
    },
)

# Qwen3-30B-A3B, MB 0.6.2 perf_recipes/qwen/gb300/qwen3_moe.py::qwen3_30b_a3b_pretrain_8gpu_gb300_*_config: TE CUDA
# graphs of router and preprocess, no full-iteration graphs or paged stash. Its base is what perf_recipes/qwen/common.py
# imports as qwen3_30b_a3b_pretrain_config: recipes/qwen/h100/qwen3_moe.py::qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config
# (the `recipes.qwen.qwen3_moe` alias of the same name is the 16-GPU recipe, which differs in parallelism and fusions).
QWEN3_MOE = ModelRecipe(
    family="qwen3_moe",
    base_recipe="megatron.bridge.recipes.qwen.h100.qwen3_moe:qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config",
    provider="megatron.bridge.models.gpt_provider:GPTModelProvider",
    published={
        "model": {
            "bias_activation_fusion": True,
            "recompute_granularity": None,
            "recompute_method": None,
            "recompute_num_layers": None,
            "moe_router_fusion": True,
            "moe_router_force_load_balancing": True,
            "cuda_graph_impl": "transformer_engine",
            "cuda_graph_scope": ["moe_router", "moe_preprocess"],
            "use_te_rng_tracker": True,  # required by CUDA graphs
        },
        "rng": {"te_rng_tracker": True},
    },
)

MODEL_RECIPES: dict[str, ModelRecipe] = {r.family: r for r in (KIMI_K2, QWEN3_MOE)}

AUTOBRIDGE_RECIPE = "recipes.autobridge:pretrain_config"
"""Base of a model read with `model=hf:<spec>` whose family has no published recipe here; takes the ModelConfig."""

HF_DEFAULTS: Sections = {"model": {"moe_permute_fusion": True, "moe_router_force_load_balancing": True}}
"""For a MoE model with no published recipe: the token-permutation fusion Bridge's own MoE recipes turn on (OLMoE,
Qwen3-MoE), and balanced routing as in the published perf recipes and the megatron engine: with learned routing the
experts' load, hence forward-backward time, follows what each optimizer taught the router (docs/bridge_recipes.md)."""


def model_recipe(model: ModelConfig) -> ModelRecipe:
    """The recipe of `model`: the published recipe of its family, else (a model read with `model=hf:<spec>`)
    Bridge's template with the provider AutoBridge makes of the config (`recipes.autobridge`).

    Raises:
        ValueError: no published recipe for the family and no Bridge bridge for the Hugging Face config.
    """
    from recipes import autobridge

    if model.family in MODEL_RECIPES:
        return MODEL_RECIPES[model.family]
    if autobridge.hf_spec(model):
        autobridge.check_bridged(model)
        return ModelRecipe(
            family=model.family,
            base_recipe=AUTOBRIDGE_RECIPE,
            provider=autobridge.PROVIDERS[model.attention],
            published=HF_DEFAULTS if model.num_experts else {},
        )
    raise ValueError(
        f"model.family={model.family!r}: no Megatron-Bridge recipe; allowed {sorted(MODEL_RECIPES)}, or any "
        "family Bridge bridges read with model=hf:<config.json>"
    )


def shape_fields(model: ModelConfig) -> dict[str, Any]:
    """Provider fields that fix the model's shapes (Megatron names)."""
    out: dict[str, Any] = {
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "ffn_hidden_size": model.ffn_hidden_size,
        "vocab_size": model.vocab_size,
        "make_vocab_size_divisible_by": model.make_vocab_size_divisible_by,
        "seq_length": model.seq_length,
    }
    if model.attention == "gqa":
        out |= {"num_query_groups": model.num_query_groups, "kv_channels": model.kv_channels}
    else:
        out |= {
            "q_lora_rank": model.q_lora_rank or None,  # 0 = no query compression
            "kv_lora_rank": model.kv_lora_rank,
            "qk_head_dim": model.qk_head_dim,
            "qk_pos_emb_head_dim": model.qk_pos_emb_head_dim,
            "v_head_dim": model.v_head_dim,
        }
    if model.num_experts:
        out |= {
            "num_moe_experts": model.num_experts,
            "moe_router_topk": model.moe_router_topk,
            "moe_ffn_hidden_size": model.moe_ffn_hidden_size,
            "moe_shared_expert_intermediate_size": model.moe_shared_expert_intermediate_size or None,
            # 1 = every layer MoE; else a per-layer list with the leading dense layers as 0.
            "moe_layer_freq": (
                [0] * model.num_dense_layers + [1] * (model.num_layers - model.num_dense_layers)
                if model.num_dense_layers
                else 1
            ),
        }
    return out


def base_sections(model: ModelConfig) -> Sections:
    """Hardware-neutral base: the model's shapes plus its published perf settings."""
    recipe = model_recipe(model)
    sections: Sections = {name: dict(values) for name, values in recipe.published.items()}
    sections.setdefault("model", {}).update(shape_fields(model))
    sections.setdefault("dataset", {})["seq_length"] = model.seq_length
    return sections
