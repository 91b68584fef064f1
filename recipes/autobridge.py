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
    """Raise ValueError (naming `model`, its family and the bridged ones) unless Bridge has a bridge for it."""
    bridged = [name for name, fam in FAMILIES.items() if fam.bridged]
    if model.family not in bridged:
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

    provider = AutoBridge.from_hf_config(read(spec, trust_remote_code=model.trust_remote_code)).to_megatron_provider(
        load_weights=False
    )
    provider.mtp_num_layers = None
    if getattr(provider, "kv_channels", 0) is None and model.kv_channels:
        provider.kv_channels = model.kv_channels  # Qwen2: Megatron would derive the same at finalize
    return provider


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
