"""Megatron-Bridge recipes of the published setups (Kimi K2, Qwen3-30B-A3B) for AdamW / Muon / MOP / SOAP-REKLS.

`recipes.overrides.build_plan(root)` is pure data (importable anywhere); `recipes.bridge.build_config_container`
imports Megatron-Bridge lazily and only works where Transformer Engine is installed (the NeMo container).
`recipes.apply_optimizer(container, "muon")` puts our optimizer into a ConfigContainer a user already has
(docs/bridge_recipes.md).
"""

from recipes.container import apply_optimizer
from recipes.overrides import AB_MODES, BridgePlan, build_overrides, build_plan
from recipes.user_recipe import load_recipe

__all__ = ["AB_MODES", "BridgePlan", "apply_optimizer", "build_overrides", "build_plan", "load_recipe"]
