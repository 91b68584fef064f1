"""Which optimizer gets each parameter, and how fused matrices are split.

Rules (MCore `get_megatron_optimizer` + emerging-optimizers routing, made explicit):

- 2-D hidden matrices and 3-D expert stacks (E, out, in) -> matrix optimizer (Muon / MOP / SOAP).
- embeddings, the output layer, 1-D parameters (norms, biases) and 2-D "vectors" (a side of 1, e.g. a shared
  expert gate) -> AdamW; MoE router weight -> matrix optimizer unless RoutingConfig.router_to_matrix is False.
- Splits (RowSplit, applied to the gradient/momentum, orthogonalized piece by piece, merged back):
  Megatron `linear_qkv` per query group into Q, K, V (split_qkv); MLA kv_down into latent and rope rows
  (split_mla_kv_down; HF `kv_a_proj_with_mqa`); fused [gate; up] fc1 (split_gate_up; Megatron `linear_fc1`,
  HF `experts.gate_up_proj`).

Names are matched by dotted path components (exact tokens), per naming convention: "hf" (transformers
Qwen3-MoE / DeepSeek-V3) or "megatron" (MCore GPT/MLA/MoE layers, TE or local specs).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from optim.configs import RoutingConfig
from optim.functional.split import RowSplit

Naming = Literal["hf", "megatron"]
NAMINGS = ("hf", "megatron")
KINDS = ("matrix", "expert_stack", "router", "embedding", "output", "norm", "bias", "vector", "other")

_EMBEDDING = {"hf": {"embed_tokens"}, "megatron": {"word_embeddings", "position_embeddings"}}
_OUTPUT = {"hf": {"lm_head"}, "megatron": {"output_layer"}}
_WEIGHT = re.compile(r"weight\d*")  # TE grouped experts: linear_fc1.weight0 ... weightN


@dataclass(frozen=True, kw_only=True, slots=True)
class SplitLayout:
    """Model dimensions the splits need (0 = unknown; a split that needs an unknown value raises)."""

    num_attention_heads: int = 0
    num_query_groups: int = 0
    kv_channels: int = 0
    """Head dim of Q/K/V under GQA."""
    kv_lora_rank: int = 0
    qk_pos_emb_head_dim: int = 0
    """MLA rope dim (HF qk_rope_head_dim)."""
    gated_linear_unit: bool = True

    @classmethod
    def from_hf_config(cls, config: Any) -> SplitLayout:
        """From a transformers config: MLA (DeepSeek-V3, Kimi K2) or GQA (Llama, Qwen, Mixtral, OLMoE, ...)."""
        if config.model_type in ("deepseek_v3", "kimi_k2"):
            return cls(
                num_attention_heads=config.num_attention_heads,
                kv_lora_rank=config.kv_lora_rank,
                qk_pos_emb_head_dim=config.qk_rope_head_dim,
            )
        heads = config.num_attention_heads
        return cls(
            num_attention_heads=heads,
            num_query_groups=getattr(config, "num_key_value_heads", None) or heads,
            kv_channels=getattr(config, "head_dim", None) or config.hidden_size // heads,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamRoute:
    """Decision for one named parameter."""

    name: str
    kind: str
    """One of KINDS."""
    optimizer: Literal["matrix", "adamw"]
    split: RowSplit | None = None
    decay: bool = True
    """AdamW side: apply weight decay (False for 1-D parameters with RoutingConfig.no_decay_1d)."""


def classify(name: str, shape: tuple[int, ...], naming: Naming) -> str:
    """Kind of a parameter from its dotted name and shape (see KINDS)."""
    if naming not in NAMINGS:
        raise ValueError(f"naming={naming!r} is not one of {NAMINGS}")
    parts = name.split(".")
    if _EMBEDDING[naming] & set(parts):
        return "embedding"
    if _OUTPUT[naming] & set(parts):
        return "output"
    if len(shape) == 1:
        return "bias" if parts[-1] == "bias" or parts[-1].endswith("_bias") else "norm"
    if _is_router(parts, naming):
        return "router"
    if len(shape) == 3:
        return "expert_stack"
    if len(shape) == 2:
        return "vector" if min(shape) == 1 else "matrix"
    return "other"


def _is_router(parts: list[str], naming: Naming) -> bool:
    if len(parts) < 3 or parts[-3] != "mlp" or not _WEIGHT.fullmatch(parts[-1]):
        return False
    return parts[-2] == ("gate" if naming == "hf" else "router")


def split_for(
    name: str, shape: tuple[int, ...], naming: Naming, routing: RoutingConfig, layout: SplitLayout
) -> RowSplit | None:
    """The RowSplit of a matrix parameter under `routing`, or None."""
    parts = name.split(".")
    module, leaf = (parts[-2] if len(parts) > 1 else ""), parts[-1]
    rows = shape[-2]
    if naming == "megatron" and routing.split_qkv and module == "linear_qkv" and leaf == "weight":
        heads, groups, d = layout.num_attention_heads, layout.num_query_groups, layout.kv_channels
        _need(name, num_attention_heads=heads, num_query_groups=groups, kv_channels=d)
        split = RowSplit(num_groups=groups, sizes=(heads // groups * d, d, d), labels=("q", "k", "v"))
        return _checked(name, rows, split)
    kv_down = "linear_kv_down_proj" if naming == "megatron" else "kv_a_proj_with_mqa"
    if routing.split_mla_kv_down and module == kv_down and leaf == "weight":
        _need(name, kv_lora_rank=layout.kv_lora_rank, qk_pos_emb_head_dim=layout.qk_pos_emb_head_dim)
        sizes = (layout.kv_lora_rank, layout.qk_pos_emb_head_dim)
        return _checked(name, rows, RowSplit(num_groups=1, sizes=sizes, labels=("latent", "rope")))
    fused_fc1 = (naming == "megatron" and module == "linear_fc1" and _WEIGHT.fullmatch(leaf) is not None) or (
        naming == "hf" and module == "experts" and leaf == "gate_up_proj"
    )
    if routing.split_gate_up and layout.gated_linear_unit and fused_fc1:
        if rows % 2:
            raise ValueError(f"{name}: {rows} rows cannot be split into [gate; up] halves")
        return RowSplit(num_groups=1, sizes=(rows // 2, rows // 2), labels=("gate", "up"))
    return None


def _need(name: str, **values: int) -> None:
    missing = [k for k, v in values.items() if v <= 0]
    if missing:
        raise ValueError(f"splitting {name} needs SplitLayout fields {missing} (got {values})")


def _checked(name: str, rows: int, split: RowSplit) -> RowSplit:
    if split.rows != rows:
        raise ValueError(f"{name}: {rows} rows do not match {split} ({split.rows} rows); check SplitLayout")
    return split


def route_parameters(
    named_params: Iterable[tuple[str, torch.Tensor]],
    *,
    naming: Naming = "hf",
    routing: RoutingConfig | None = None,
    layout: SplitLayout | None = None,
) -> list[ParamRoute]:
    """Route every trainable parameter (requires_grad) in order; see the module docstring for the rules."""
    routing = routing or RoutingConfig()
    layout = layout or SplitLayout()
    routes = []
    for name, p in named_params:
        if not p.requires_grad:
            continue
        shape = tuple(p.shape)
        kind = classify(name, shape, naming)
        to_matrix = kind in ("matrix", "expert_stack") or (kind == "router" and routing.router_to_matrix)
        if to_matrix:
            split = split_for(name, shape, naming, routing, layout)
            routes.append(ParamRoute(name=name, kind=kind, optimizer="matrix", split=split))
        else:
            decay = not (routing.no_decay_1d and p.ndim == 1)
            routes.append(ParamRoute(name=name, kind=kind, optimizer="adamw", decay=decay))
    return routes
