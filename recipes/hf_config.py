"""The Hugging Face model config Megatron-Bridge's recipes read, written locally from `conf/model`: no rank needs
the network, and no remote code runs.

Bridge's recipe functions build the model provider with `AutoBridge.from_hf_pretrained(<repo id>, ...)`, which reads
`config.json` of a Hub repository (Kimi K2's with `trust_remote_code=True`). Compute nodes often have no network, and
every rank would download it. `offline_hub(model, root)` writes that `config.json` from our `ModelConfig` into a
Hub cache under `root` (the repository and revision the recipe asks for) and points `huggingface_hub` at it in
offline mode, so the recipe resolves the file locally.

- Qwen3-MoE: `model_type` qwen3_moe (transformers' own config class).
- Kimi K2 (family deepseek_v3): the published config names model_type `kimi_k2` with remote code that only
  subclasses DeepSeek-V3's config; we write `model_type: deepseek_v3` (transformers' own DeepseekV3Config, no remote
  code) and keep the architecture name `KimiK2ForCausalLM`, by which Bridge picks its Kimi K2 bridge.
Values not in `ModelConfig` are the published configs' (docs/references.md#model-shapes).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from muonbench.families import config_json
from muonbench.schema import ModelConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class HubSource:
    """The Hub repository (and revision) a Bridge recipe reads its model config from."""

    repo_id: str
    revision: str | None
    """The commit the recipe pins; None: the recipe reads `main`."""


HUB_SOURCES: dict[str, HubSource] = {
    # megatron.bridge.recipes.qwen.h100.qwen3_moe: _QWEN3_30B_A3B_MODEL_ID / _QWEN3_30B_A3B_MODEL_REVISION
    "qwen3_moe": HubSource(repo_id="Qwen/Qwen3-30B-A3B", revision="ad44e777bcd18fa416d9da3bd8f70d33ebb85d39"),
    # megatron.bridge.recipes.kimi.h100.kimi_k2: AutoBridge.from_hf_pretrained("moonshotai/Kimi-K2-Instruct", ...)
    "deepseek_v3": HubSource(repo_id="moonshotai/Kimi-K2-Instruct", revision=None),
}


def _qwen3_moe(config: dict[str, Any]) -> dict[str, Any]:
    """Qwen/Qwen3-30B-A3B's published values."""
    return {**config, "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}


def _kimi_k2(config: dict[str, Any]) -> dict[str, Any]:
    """moonshotai/Kimi-K2-Instruct's published values, under transformers' own DeepSeek-V3 model_type."""
    yarn = {"beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    return {
        **config,
        "architectures": ["KimiK2ForCausalLM"],
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
        "rope_scaling": {**config.get("rope_scaling", {}), **yarn},
    }


PUBLISHED = {"qwen3_moe": _qwen3_moe, "deepseek_v3": _kimi_k2}
"""Per family: the values of the published config its Bridge recipe reads that `ModelConfig` does not hold."""


def hf_config(model: ModelConfig) -> dict[str, Any]:
    """The `config.json` contents of `model` in the form its Bridge recipe reads: `muonbench.hf_export`'s
    `muonbench.families.config_json` (unpadded vocabulary: Bridge pads it) with the published values (`PUBLISHED`).

    Raises:
        ValueError: no Bridge recipe reads a Hub config for `model.family`.
    """
    if model.family not in PUBLISHED:
        raise ValueError(f"model.family={model.family!r}: allowed {sorted(PUBLISHED)}")
    return PUBLISHED[model.family](config_json(model))


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_snapshot(model: ModelConfig, hub_cache: Path) -> Path:
    """Write `model`'s config into a Hub cache at `hub_cache` (huggingface_hub's layout); returns the config path.

    Safe when several ranks write the same cache (atomic renames of identical contents).
    """
    source = HUB_SOURCES[model.family]
    text = json.dumps(hf_config(model), indent=1, sort_keys=True) + "\n"
    revision = source.revision or hashlib.sha1(text.encode()).hexdigest()
    repo = hub_cache / f"models--{source.repo_id.replace('/', '--')}"
    config = repo / "snapshots" / revision / "config.json"
    _atomic_write(config, text)
    _atomic_write(repo / "refs" / "main", revision)
    return config


def offline_hub(model: ModelConfig, root: Path) -> dict[str, str]:
    """Write `model`'s config under `root` and switch this process's Hugging Face Hub to it, offline.

    Sets `HF_HUB_CACHE` and `HF_HUB_OFFLINE=1` (and huggingface_hub's module constants when it is already imported,
    which reads them at import); returns the variables set, for the run record.
    """
    hub_cache = Path(root).resolve() / "hub"
    write_snapshot(model, hub_cache)
    env = {"HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}
    os.environ.update(env)
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_CACHE = str(hub_cache)
        constants.HF_HUB_OFFLINE = True
    return env
