"""Import the real Megatron-Bridge 0.6.2 on a machine without Transformer Engine (tests only, never the product).

`import megatron.bridge` reaches Transformer Engine at exactly one import: `megatron/bridge/peft/lora_layers.py`
(`import transformer_engine.pytorch as te`), through Bridge's PEFT package, which the training path we test never
uses. Where TE is missing, that one module is stood in for by a module holding the names other Bridge modules import
from it; nothing else is replaced, and Megatron-Core still sees no Transformer Engine (its local layer specs are
used, as on a CPU). Where TE is installed, nothing is stood in for.
"""

from __future__ import annotations

import importlib.util
import sys
import types

LORA_MODULE = "megatron.bridge.peft.lora_layers"
LORA_NAMES = ("LinearAdapter", "LoRALinear", "LoRATopKRouter", "TEFusedLoRALinear", "TELinearAdapter")
"""What Bridge 0.6.2 modules import from lora_layers (peft/lora.py, peft/canonical_lora.py)."""


def _has(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def import_bridge() -> types.ModuleType:
    """`megatron.bridge`, with the LoRA-layers stand-in where Transformer Engine is not installed."""
    if not _has("transformer_engine") and LORA_MODULE not in sys.modules:
        stand_in = types.ModuleType(LORA_MODULE)
        stand_in.__doc__ = "Test stand-in: the real module needs Transformer Engine (tests/bridge_live.py)."
        for name in LORA_NAMES:
            setattr(stand_in, name, type(name, (), {"__module__": LORA_MODULE}))
        sys.modules[LORA_MODULE] = stand_in
    import megatron.bridge

    return megatron.bridge


def bridge_importable() -> str | None:
    """None when the real Bridge can be imported here, else the reason (for a skip)."""
    if not _has("megatron.bridge"):
        return "megatron-bridge is not installed (make install adds it)"
    try:
        import_bridge()
    except ImportError as exc:  # a Bridge runtime dependency missing: tests/requirements-bridge.txt
        return f"megatron.bridge does not import: {exc}"
    return None
