"""Which optimizer gets each parameter, and how fused matrices are split.

Rules (MCore `get_megatron_optimizer` + emerging-optimizers routing, made explicit):

- 2-D hidden matrices and 3-D expert stacks (E, out, in) -> matrix optimizer (Muon / MOP / SOAP).
- embeddings, the output layer, 1-D parameters (norms, biases), 2-D "vectors" (a side of 1, e.g. a shared
  expert gate) and empty parameters -> AdamW; MoE router weight -> matrix optimizer unless
  RoutingConfig.router_to_matrix is False.
- Embeddings and the output layer are found by module type when the model is given (`route_parameters(model)` or
  `model=`): every `nn.Embedding` / `nn.EmbeddingBag` (a tied head shares its weight), and the model's
  `get_output_embeddings()` or else any `nn.Linear` with the largest embedding's vocabulary size as outputs. From names alone they are
  the known names below, a tensor listed twice (tied) and a matrix shaped like a found embedding; a matrix that
  looks vocabulary-sized but matches none of these is routed `matrix` with a RoutingWarning naming it.
- Splits (RowSplit, applied to the gradient/momentum, orthogonalized piece by piece, merged back):
  Megatron `linear_qkv` per query group into Q, K, V (split_qkv); MLA kv_down into latent and rope rows
  (split_mla_kv_down; HF `kv_a_proj_with_mqa`); fused [gate; up] fc1 (split_gate_up; Megatron `linear_fc1`,
  HF `experts.gate_up_proj`).

Names are matched by dotted path components (exact tokens), per naming convention: "hf" (transformers: Llama,
Qwen, DeepSeek-V3, GPT-2, GPT-NeoX, T5, BERT) or "megatron" (MCore GPT/MLA/MoE layers, TE or local specs).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from optim.configs import RoutingConfig
from optim.functional.split import RowSplit

Naming = Literal["hf", "megatron"]
NAMINGS = ("hf", "megatron")
KINDS = ("matrix", "expert_stack", "router", "embedding", "output", "norm", "bias", "vector", "other")

_EMBEDDING = {
    "hf": {
        "embed_tokens",
        "wte",
        "wpe",
        "embed_in",
        "shared",
        "word_embeddings",
        "position_embeddings",
        "token_type_embeddings",
        "embed_positions",
        "relative_attention_bias",
    },
    "megatron": {"word_embeddings", "position_embeddings"},
}
_OUTPUT = {"hf": {"lm_head", "embed_out"}, "megatron": {"output_layer"}}
_VOCAB_ASPECT = 8
"""A 2-D parameter whose long side is at least this many times its short side and the longest of all matrices
looks like a vocabulary table (embedding or output head) when names cannot tell."""


class RoutingWarning(UserWarning):
    """A parameter whose routing could not be told from names and shapes (pass the model to route by type)."""


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
    parts = set(name.split("."))
    if _EMBEDDING[naming] & parts:
        return "embedding"
    if _OUTPUT[naming] & parts:
        return "output"
    return _shape_kind(name, shape, naming)


def _shape_kind(name: str, shape: tuple[int, ...], naming: Naming) -> str:
    """Kind of a parameter that is neither an embedding nor the output layer."""
    parts = name.split(".")
    if parts[-1] == "bias" or parts[-1].endswith("_bias"):  # any rank: stacked experts' biases are 2-D (gpt-oss)
        return "bias"
    if len(shape) == 1:
        return "norm"
    if _is_router(parts, naming):
        return "router"
    if len(shape) == 3:
        return "expert_stack"
    if len(shape) == 2:
        return "vector" if min(shape) == 1 else "matrix" if min(shape) > 1 else "other"
    return "other"


def _is_router(parts: list[str], naming: Naming) -> bool:
    if len(parts) < 3 or parts[-3] != "mlp" or not _WEIGHT.fullmatch(parts[-1]):
        return False
    return parts[-2] in (("gate", "router") if naming == "hf" else ("router",))  # hf: gpt-oss names it router


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


def module_kinds(model: torch.nn.Module) -> dict[int, str]:
    """id(parameter) -> "embedding" | "output" for a model's embeddings and output head, by module type."""
    kinds: dict[int, str] = {}
    vocab = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding | torch.nn.EmbeddingBag):
            kinds.update({id(p): "embedding" for p in m.parameters(recurse=False)})
            vocab = max(vocab, m.weight.shape[0])
    get_output = getattr(model, "get_output_embeddings", None)  # transformers' PreTrainedModel API
    head = get_output() if callable(get_output) else None
    heads = [head] if isinstance(head, torch.nn.Module) else []
    if not heads:  # no declared head: a Linear with the largest embedding's vocabulary as outputs
        heads = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == vocab]
    for h in heads:
        for p in h.parameters(recurse=False):
            kinds.setdefault(id(p), "output")
    return kinds


def _name_kinds(named: list[tuple[str, torch.Tensor]], naming: Naming) -> dict[int, str]:
    """id(parameter) -> "embedding" | "output" from names alone: known names, tied tensors, embedding shapes."""
    kinds: dict[int, str] = {}
    seen: dict[int, int] = {}
    for name, p in named:
        seen[id(p)] = seen.get(id(p), 0) + 1
        parts = set(name.split("."))
        if _EMBEDDING[naming] & parts:
            kinds[id(p)] = "embedding"
        elif _OUTPUT[naming] & parts:
            kinds[id(p)] = "output"
    kinds.update({i: "embedding" for i, n in seen.items() if n > 1 and i not in kinds})
    shapes = {tuple(p.shape) for _, p in named if kinds.get(id(p)) == "embedding"}
    last = [p for _, p in named if p.ndim == 2][-1:]  # an untied head shaped like the embedding comes last
    for p in last:
        if id(p) not in kinds and (tuple(p.shape) in shapes or tuple(p.shape)[::-1] in shapes):
            kinds[id(p)] = "output"
    return kinds


def _warn_unknown_vocab(named: list[tuple[str, torch.Tensor]], kinds: Mapping[int, str]) -> None:
    if any(k == "embedding" for k in kinds.values()):
        return
    mats = [(n, p) for n, p in named if p.ndim == 2 and min(p.shape) > 1 and id(p) not in kinds]
    longest = max((max(p.shape) for _, p in mats), default=0)
    odd = [
        f"{n} {tuple(p.shape)}" for n, p in mats if max(p.shape) == longest >= _VOCAB_ASPECT * min(p.shape)
    ]
    if odd:
        warnings.warn(
            f"cannot tell whether {', '.join(odd)} is an embedding or output head (routed to the matrix "
            "optimizer); pass the model (route_parameters(model) / build_optimizer(model, ...)) to route "
            "nn.Embedding and the output layer to AdamW by module type",
            RoutingWarning,
            stacklevel=3,
        )


def named_parameters(params: Any) -> tuple[list[tuple[str, torch.Tensor]], torch.nn.Module | None]:
    """(name, parameter) pairs and the model from a model, (name, parameter) pairs or plain tensors (named by
    position, "0", "1", ...); refuses anything else naming what it got."""
    if isinstance(params, torch.nn.Module):
        return list(params.named_parameters()), params
    items = list(params)
    if all(isinstance(x, torch.Tensor) for x in items):
        return [(str(i), p) for i, p in enumerate(items)], None
    bad = [x for x in items if not (isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], torch.Tensor))]
    if bad:
        raise TypeError(
            f"parameters must be a model, (name, tensor) pairs or tensors; got {type(bad[0]).__name__} {bad[0]!r:.60}"
        )
    return [(str(n), p) for n, p in items], None


def route_parameters(
    named_params: Iterable[tuple[str, torch.Tensor]] | Iterable[torch.Tensor] | torch.nn.Module,
    *,
    naming: Naming = "hf",
    routing: RoutingConfig | None = None,
    layout: SplitLayout | None = None,
    model: torch.nn.Module | None = None,
) -> list[ParamRoute]:
    """Route every trainable parameter (requires_grad) in order; see the module docstring for the rules.

    Args:
        named_params: a model, its `named_parameters()`, or plain tensors.
        model: the model the parameters belong to, so embeddings and the output head are found by module type
            (implied when `named_params` is the model).
    """
    if naming not in NAMINGS:
        raise ValueError(f"naming={naming!r} is not one of {NAMINGS}")
    routing = routing or RoutingConfig()
    layout = layout or SplitLayout()
    named, own = named_parameters(named_params)
    model = model or own
    if model is not None:
        kinds = module_kinds(model)
    else:
        kinds = _name_kinds(named, naming)
        _warn_unknown_vocab([(n, p) for n, p in named if p.requires_grad], kinds)
    routes = []
    done: set[int] = set()
    for name, p in named:
        if not p.requires_grad or id(p) in done:
            continue
        done.add(id(p))
        shape = tuple(p.shape)
        kind = kinds.get(id(p)) or _shape_kind(name, shape, naming)
        to_matrix = kind in ("matrix", "expert_stack") or (kind == "router" and routing.router_to_matrix)
        if to_matrix:
            split = split_for(name, shape, naming, routing, layout)
            routes.append(ParamRoute(name=name, kind=kind, optimizer="matrix", split=split))
        else:
            decay = not (routing.no_decay_1d and p.ndim == 1)
            routes.append(ParamRoute(name=name, kind=kind, optimizer="adamw", decay=decay))
    return routes
