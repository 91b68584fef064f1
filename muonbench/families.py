"""Model families: the one table of what the product knows about each transformers `model_type`.

A family is one entry: its Hugging Face causal-LM class, the reader that maps its `config.json` to `ModelConfig`
fields (`muonbench.hf_model`), the exporter that writes `ModelConfig` back as its `config.json` (`muonbench.hf_export`),
whether Megatron-Bridge has a bridge for it and whether its layers are mixtures of experts. `model.family`,
`model=hf:<spec>`, the hf engine's model, the Bridge recipes and the config checks all read this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from muonbench import hf_export, hf_model
from muonbench.schema import ModelConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class Family:
    """One transformers model family."""

    architecture: str
    """Its causal-LM class (`config.json` `architectures`), the key of Megatron-Bridge's bridge registry."""
    read: Callable[[Any], dict[str, Any]]
    """A transformers config of the family -> `ModelConfig` fields (`model=hf:<spec>`)."""
    export: Callable[[ModelConfig], dict[str, Any]]
    """`ModelConfig` -> the family's own `config.json` keys (beside `hf_export.common`)."""
    moe: bool
    """Its builders make mixture-of-experts layers (`model.num_experts` >= 1)."""
    bridged: bool
    """Megatron-Bridge 0.6.2 registers a bridge for `architecture` (engine=bridge; a test reads Bridge's source)."""
    qkv_bias: bool = False
    """Its transformers attention has biases on the query, key and value projections (Qwen2): the hf engine and
    Bridge build the family's, so `model.qkv_bias` must equal it there."""
    aliases: tuple[str, ...] = ()
    """Further model_types read as this family (their configs are this family's, from remote code)."""
    features: tuple[str, ...] = ()
    """Architecture features every model of the family has beyond the plain pre-norm decoder (`features`): an
    engine that does not build the family's own layers refuses them."""
    attn_implementation: str = "sdpa"
    """transformers' attention of the hf engine: `eager` where its SDPA path would drop a feature (gpt-oss's sinks)."""


FAMILIES: dict[str, Family] = {
    "llama": Family(architecture="LlamaForCausalLM", read=hf_model.llama, export=hf_export.dense, moe=False,
                    bridged=True),
    "mistral": Family(architecture="MistralForCausalLM", read=hf_model.llama, export=hf_export.dense, moe=False,
                      bridged=True),
    "qwen2": Family(architecture="Qwen2ForCausalLM", read=hf_model.qwen2, export=hf_export.qwen2, moe=False,
                    bridged=True, qkv_bias=True),
    "qwen3": Family(architecture="Qwen3ForCausalLM", read=hf_model.qwen3, export=hf_export.dense, moe=False,
                    bridged=True),
    "qwen3_moe": Family(architecture="Qwen3MoeForCausalLM", read=hf_model.qwen3_moe, export=hf_export.qwen3_moe,
                        moe=True, bridged=True),
    # Megatron-Bridge 0.6.2 has no Mixtral bridge: it runs through the hf and megatron engines
    "mixtral": Family(architecture="MixtralForCausalLM", read=hf_model.mixtral, export=hf_export.routed, moe=True,
                      bridged=False),
    "olmoe": Family(architecture="OlmoeForCausalLM", read=hf_model.olmoe, export=hf_export.routed, moe=True,
                    bridged=True),
    "deepseek_v3": Family(architecture="DeepseekV3ForCausalLM", read=hf_model.deepseek_v3,
                          export=hf_export.deepseek_v3, moe=True, bridged=True, aliases=("kimi_k2",)),
    "deepseek_v2": Family(architecture="DeepseekV2ForCausalLM", read=hf_model.deepseek_v2,
                          export=hf_export.deepseek_v2, moe=True, bridged=True),
    "gpt_oss": Family(architecture="GptOssForCausalLM", read=hf_model.gpt_oss, export=hf_export.gpt_oss, moe=True,
                      bridged=True, qkv_bias=True, attn_implementation="eager",
                      features=("attention sinks", "biases on every linear layer", "clamped SwiGLU experts")),
    # Megatron-Bridge 0.6.2 has no Qwen2-MoE or Phi-3 bridge
    "qwen2_moe": Family(architecture="Qwen2MoeForCausalLM", read=hf_model.qwen2_moe, export=hf_export.qwen2_moe,
                        moe=True, bridged=False, qkv_bias=True, features=("shared-expert gate",)),
    "gemma2": Family(architecture="Gemma2ForCausalLM", read=hf_model.gemma2, export=hf_export.gemma2, moe=False,
                     bridged=True, features=("logit soft-capping", "post-norms", "embedding scaling")),
    "phi3": Family(architecture="Phi3ForCausalLM", read=hf_model.phi3, export=hf_export.dense, moe=False,
                   bridged=False),
}  # fmt: skip
"""`model.family` (the transformers model_type) -> its entry."""


def features(model: ModelConfig) -> dict[str, tuple[str, Any]]:
    """The architecture features of `model` beyond the plain pre-norm decoder -> the (field, value) that asks for
    it; an engine refuses the ones it does not build (`muonbench.engines.check_features`)."""
    out: dict[str, tuple[str, Any]] = {}
    if model.sliding_window:
        out["sliding-window attention"] = ("model.sliding_window", model.sliding_window)
    if model.rope_scaling_factor != 1.0 and model.rope_scaling_type == "llama3":
        out["llama3 RoPE scaling"] = ("model.rope_scaling_type", model.rope_scaling_type)
    if model.activation != "silu":
        out["GeGLU feed-forward"] = ("model.activation", model.activation)
    fam = FAMILIES.get(model.family)
    for name in fam.features if fam else ():
        out[name] = ("model.family", model.family)
    return out


def model_types() -> dict[str, str]:
    """Every model_type `model=hf:<spec>` reads -> the family it is read as (Kimi K2 -> deepseek_v3)."""
    return {t: name for name, fam in FAMILIES.items() for t in (name, *fam.aliases)}


def family(name: str) -> Family:
    """The entry of `model.family`; ValueError naming the value and the families."""
    if name not in FAMILIES:
        raise ValueError(f"model.family={name!r}: no such model family; allowed: {list(FAMILIES)}")
    return FAMILIES[name]


BRIDGE_READER = "recipes.autobridge:model_fields"
"""Where a model_type outside the table is read, through Megatron-Bridge's AutoBridge (engine=bridge only)."""


def read(spec: str, *, trust_remote_code: bool = False, any_type: bool = False) -> Any:
    """The transformers config of `spec`, of a model_type in the table (`hf_model.read`); `any_type`: of any
    model_type transformers reads (AutoBridge decides whether it bridges it)."""
    supported = model_types()
    if any_type:
        supported = {**supported, hf_model.model_type(spec): ""}
    return hf_model.read(spec, supported=supported, trust_remote_code=trust_remote_code)


def model_fields(spec: str, *, trust_remote_code: bool = False) -> dict[str, Any]:
    """The `ModelConfig` fields of `spec` (name and source included), ready to fill the model group: the table's
    reader of its family, or, for another model_type, the fields of the provider Megatron-Bridge's AutoBridge
    builds of it where Bridge imports (`BRIDGE_READER`; such a model runs on engine=bridge only).
    Bridge itself is imported only there, never by this package.

    Raises:
        HFConfigError: naming the field when the config cannot be read or represented.
    """
    if hf_model.model_type(spec) not in model_types():  # refused as the table refuses it where Bridge does not import
        from optim import registry

        out = registry.load(BRIDGE_READER)(spec, trust_remote_code=trust_remote_code)
    else:
        cfg = read(spec, trust_remote_code=trust_remote_code)
        out = FAMILIES[model_types()[cfg.model_type]].read(cfg)
    return {
        "name": hf_model.model_name(spec),
        **out,
        "source": f"hf:{spec}",
        "trust_remote_code": trust_remote_code,
    }


def config_json(model: ModelConfig, *, vocab_size: int | None = None) -> dict[str, Any]:
    """The `config.json` contents of `model` (transformers' config of `model.family`).

    Args:
        model: the model.
        vocab_size: the vocabulary to write; None: `model.vocab_size` (unpadded, as the published configs).

    Raises:
        ValueError: a family outside the table, or a value its transformers config cannot express.
    """
    fam = family(model.family)
    vocab = model.vocab_size if vocab_size is None else vocab_size
    return {**hf_export.common(model, fam.architecture, vocab), **fam.export(model)}
