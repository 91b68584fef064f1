"""Parameter classification: where each Megatron parameter goes (matrix optimizer or AdamW) and how it is treated.

Routing follows Megatron's parameter attributes, not only names (rules in the `optim.megatron` docstring); also the
TP specs of the sharded matrices and the orthogonalized shapes (for NS FLOP counts).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from optim.configs import TP_MODE_CHOICES, RoutingConfig
from optim.functional.split import RowSplit

_MLA_ROLES = {
    "linear_q_proj": "mla_q",
    "linear_q_down_proj": "mla_q_down",
    "linear_q_up_proj": "mla_q_up",
    "linear_kv_down_proj": "mla_kv_down",
    "linear_kv_up_proj": "mla_kv_up",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamRoute:
    """Where one Megatron parameter goes and how it is treated there."""

    name: str
    """Megatron parameter name, e.g. decoder.layers.0.self_attention.linear_qkv.weight."""
    role: str
    """embedding | output | qkv | attn_proj | mla_q | mla_q_down | mla_q_up | mla_kv_down | mla_kv_up | router |
    expert_fc1 | expert_fc2 | shared_fc1 | shared_fc2 | dense_fc1 | dense_fc2 | norm | bias | other."""
    optimizer: str
    """matrix (Muon / MOP / SOAP) | adamw."""
    shape: tuple[int, ...]
    is_expert: bool
    """A routed expert's weight (not a shared expert)."""
    expert_parallel: bool
    """Megatron allreduce=False: gradients reduced over the expert-DP group, state owned per expert-DP group."""
    partition_dim: int | None
    """Tensor-parallel sharded dim (0 column-parallel, 1 row-parallel), None when not sharded."""
    split: RowSplit | None
    """Row-block split before orthogonalization (Q/K/V, latent/rope, gate/up); None = whole matrix."""
    weight_decay: bool
    """False for 1-D parameters on the AdamW side (MCore default)."""


def _role(name: str, param: torch.Tensor) -> str:
    parts = name.split(".")
    leaf = parts[-1]
    owner = parts[-2] if len(parts) >= 2 else ""
    if getattr(param, "is_embedding_or_output_parameter", False):
        return "output" if "output_layer" in name else "embedding"
    if "word_embeddings" in name:
        return "embedding"
    if leaf == "bias" or leaf.startswith("bias"):
        return "bias"
    if param.ndim == 1:
        return "norm"
    if owner == "router":
        return "router"
    if owner == "linear_qkv":
        return "qkv"
    if owner in _MLA_ROLES:
        return _MLA_ROLES[owner]
    if owner == "linear_proj":
        return "attn_proj"
    # TE grouped experts name weights `weight<k>` under linear_fc1/linear_fc2.
    fc = "fc1" if owner == "linear_fc1" else "fc2" if owner == "linear_fc2" else ""
    if fc:
        if "shared_experts" in name:
            return f"shared_{fc}"
        if ".experts." in name:
            return f"expert_{fc}"
        return f"dense_{fc}"
    return "other"


def qkv_split(model_config: Any, rows: int) -> RowSplit | None:
    """Per-query-group [q, (gate,) k, v] blocks of a (TP-local) linear_qkv weight with `rows` rows (MCore layout)."""
    heads, groups, d = (
        model_config.num_attention_heads,
        model_config.num_query_groups,
        model_config.kv_channels,
    )
    if not groups or not d:
        return None
    q = heads // groups * d
    gated = bool(getattr(model_config, "attention_output_gate", False))
    sizes = (q, q, d, d) if gated else (q, d, d)
    labels = ("q", "gate", "k", "v") if gated else ("q", "k", "v")
    if rows % sum(sizes):
        return None
    return RowSplit(num_groups=rows // sum(sizes), sizes=sizes, labels=labels)


def classify_parameter(
    name: str, param: torch.Tensor, model_config: Any, routing: RoutingConfig
) -> ParamRoute:
    """Route one Megatron parameter (rules in the `optim.megatron` docstring)."""
    role = _role(name, param)
    to_adam = role in ("embedding", "output", "norm", "bias", "other") or param.ndim != 2
    if role == "router" and not routing.router_to_matrix:
        to_adam = True
    split = None
    if not to_adam:
        rows = param.size(0)
        if role == "qkv" and routing.split_qkv:
            split = qkv_split(model_config, rows)
        elif role == "mla_kv_down" and routing.split_mla_kv_down:
            split = RowSplit(
                num_groups=1,
                sizes=(model_config.kv_lora_rank, model_config.qk_pos_emb_head_dim),
                labels=("latent", "rope"),
            )
        elif (
            role.endswith("fc1")
            and routing.split_gate_up
            and model_config.gated_linear_unit
            and rows % 2 == 0
        ):
            split = RowSplit(num_groups=1, sizes=(rows // 2, rows // 2), labels=("gate", "up"))
    tp_sharded = bool(getattr(param, "tensor_model_parallel", False))
    return ParamRoute(
        name=name,
        role=role,
        optimizer="adamw" if to_adam else "matrix",
        shape=tuple(param.shape),
        is_expert=role.startswith("expert_"),
        expert_parallel=not getattr(param, "allreduce", True),
        partition_dim=_partition_dim(param) if tp_sharded else None,
        split=split,
        weight_decay=not (to_adam and routing.no_decay_1d and param.ndim == 1),
    )


def _partition_dim(param: torch.Tensor) -> int | None:
    dim = int(getattr(param, "partition_dim", -1))
    return dim if dim >= 0 else None


def classify(
    model_chunks: Iterable[torch.nn.Module], routing: RoutingConfig
) -> list[tuple[torch.Tensor, ParamRoute]]:
    """(parameter, route) for every trainable parameter of the (DDP/Float16-wrapped or bare) Megatron chunks."""
    out: list[tuple[torch.Tensor, ParamRoute]] = []
    for chunk in model_chunks:
        model_config = _model_config(chunk)
        for name, p in chunk.named_parameters():
            if p.requires_grad:
                out.append((p, classify_parameter(_strip_wrappers(name), p, model_config, routing)))
    return out


def _strip_wrappers(name: str) -> str:
    while name.startswith("module."):
        name = name[len("module.") :]
    return name


def _model_config(chunk: torch.nn.Module) -> Any:
    from megatron.core.utils import get_model_config

    return get_model_config(chunk)


def tp_specs(
    routed: list[tuple[torch.Tensor, ParamRoute]], groups: dict[str, Any], tp_mode: str
) -> dict[torch.Tensor, Any]:
    """TPSpec of every TP-sharded matrix parameter for `tp_mode` (none for "blockwise": each shard is a matrix).

    `groups` as `process_groups()`: "tp" for dense weights, "expt_tp" for routed experts' weights; a parameter whose
    group is missing or of size 1 gets no spec."""
    from optim.optimizers.tp import TPSpec

    if tp_mode not in TP_MODE_CHOICES:
        raise ValueError(f"tp_mode={tp_mode!r} is not one of {TP_MODE_CHOICES}")
    if tp_mode == "blockwise":
        return {}
    specs: dict[torch.Tensor, Any] = {}
    for p, r in routed:
        if r.optimizer != "matrix" or r.partition_dim is None:
            continue
        group = groups["expt_tp"] if r.is_expert else groups["tp"]
        if group is None or group.size() == 1:
            continue
        specs[p] = TPSpec(partition_dim=r.partition_dim, group=group, mode=tp_mode)
    return specs


def matrix_shapes(routes: list[ParamRoute]) -> list[tuple[int, int]]:
    """(rows, cols) of every matrix our optimizer orthogonalizes (split pieces separately), for NS FLOP counts."""
    out = []
    for r in routes:
        if r.optimizer != "matrix":
            continue
        rows, cols = r.shape[-2], r.shape[-1]
        count = r.shape[0] if len(r.shape) == 3 else 1
        pieces = (
            [(rows, cols)] if r.split is None else [(r.split.num_groups * s, cols) for s in r.split.sizes]
        )
        out.extend(pieces * count)
    return out
