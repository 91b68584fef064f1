"""The one Megatron-core adapter: parameter classification, optimizer builders, version differences.

Every `megatron.core` import of `optim/` lives in this module (lazily, inside functions), so `optim` itself imports
with torch alone. Three builders, all returning a Megatron `MegatronOptimizer` that Megatron's training loop drives
(`zero_grad`, `step() -> (ok, grad_norm, zeros)`, `state_dict` / `load_state_dict` for checkpoints):

- `build_ours`: our Muon / MOP / SOAP on the matrices, torch fused AdamW on the rest, each wrapped in Megatron's
  `Float16OptimizerWithFloat16Params` (fp32 main params from the bf16 model, grads from DDP's main_grad, global-norm
  clipping) and chained (`ChainedOptimizer`), the way Megatron chains Muon with Adam.
- `build_megatron_muon`: Megatron's built-in Muon (`get_megatron_optimizer` with optimizer "muon" ->
  `TensorParallelMuon` + `LayerWiseDistributedOptimizer`, legacy ping-pong path, as Megatron-Bridge runs it).
  Needs emerging-optimizers (0.3.x) importable.
- `build_megatron_adamw`: AdamW through Megatron's `DistributedOptimizer` (or Float16 wrapper without it). Without
  Transformer Engine or Apex, Megatron falls back to `torch.optim.AdamW` in for-each mode; `fuse_torch_adam` switches
  it to torch's fused kernel so the baseline is not artificially slow.

Routing follows Megatron's parameter attributes, not only names: `is_embedding_or_output_parameter` and ndim != 2
go to AdamW; `allreduce=False` marks expert-parallel parameters (reduced over expert-DP); names with "experts" but not
"shared" are experts (MCore's test, needed at EP=1 where experts keep allreduce=True); `partition_dim` is the TP
sharded dim; the fused `linear_qkv` is split per query group into Q, K, V (MCore `_get_qkv_split_shapes`); MLA's
`linear_kv_down_proj` ([latent; rope] rows) and gated `linear_fc1` ([gate; up]) are split on request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from optim.configs import AdamWConfig, MOPConfig, MuonConfig, RoutingConfig, SOAPConfig
from optim.functional.split import RowSplit

MatrixConfig = MuonConfig | MOPConfig | SOAPConfig
IMPLEMENTATIONS = ("ours", "megatron")
TP_MODES = ("blockwise", "duplicated", "distributed")

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
    """Route one Megatron parameter (see the module docstring for the rules)."""
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


def process_groups() -> dict[str, Any]:
    """Megatron's groups an optimizer needs: tp, expert tp, dp x cp, expert dp (parallel_state must be set up)."""
    from megatron.core import parallel_state as ps

    return {
        "tp": ps.get_tensor_model_parallel_group(),
        "expt_tp": ps.get_expert_tensor_parallel_group(),
        "dp_cp": ps.get_data_parallel_group(with_context_parallel=True),
        "expt_dp": ps.get_expert_data_parallel_group(),
    }


# ----------------------------------------------------------------------------------------------------------------
# Megatron OptimizerConfig, version differences handled once
# ----------------------------------------------------------------------------------------------------------------
def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def megatron_optimizer_config(
    *,
    optimizer: str,
    adamw: AdamWConfig,
    clip_grad: float,
    use_distributed_optimizer: bool,
    bf16: bool = True,
    muon: MuonConfig | None = None,
    routing: RoutingConfig | None = None,
    tp_mode: str = "blockwise",
) -> Any:
    """Megatron `OptimizerConfig` for adam (baseline, or the Adam side of ours) or Megatron's built-in muon.

    Version differences: `muon_nesterov` (core >= 0.18) was `muon_use_nesterov`; layer-wise Muon is
    `optimizer="muon"` + `use_layer_wise_distributed_optimizer` (core >= 0.18) or `optimizer="dist_muon"` before.
    """
    from megatron.core.optimizer import OptimizerConfig

    have = _fields(OptimizerConfig)
    kw: dict[str, Any] = {
        "optimizer": "adam",
        "lr": adamw.lr,
        "min_lr": adamw.lr,
        "weight_decay": adamw.weight_decay,
        "adam_beta1": adamw.betas[0],
        "adam_beta2": adamw.betas[1],
        "adam_eps": adamw.eps,
        "clip_grad": clip_grad,
        "bf16": bf16,
        "params_dtype": torch.bfloat16 if bf16 else torch.float32,
        "use_distributed_optimizer": use_distributed_optimizer,
    }
    if optimizer == "muon":
        if muon is None or routing is None:
            raise ValueError("optimizer='muon' needs the muon and routing configs")
        if tp_mode not in TP_MODES:
            raise ValueError(f"tp_mode={tp_mode!r} is not one of {TP_MODES} for Megatron's built-in Muon")
        if muon.coefficient_type == "custom":
            raise ValueError("coefficient_type='custom' is not available in Megatron's built-in Muon")
        kw.update(
            lr=muon.lr,
            min_lr=muon.lr,
            weight_decay=muon.weight_decay,
            use_distributed_optimizer=False,
            muon_momentum=muon.momentum,
            muon_split_qkv=routing.split_qkv,
            muon_scale_mode=muon.scale_mode,
            muon_fp32_matmul_prec="medium" if muon.ns_precision == "bf16" else "highest",
            muon_coefficient_type=muon.coefficient_type,
            muon_num_ns_steps=muon.num_ns_steps,
            muon_tp_mode=tp_mode,
            muon_extra_scale_factor=muon.extra_scale_factor,
        )
        kw["muon_nesterov" if "muon_nesterov" in have else "muon_use_nesterov"] = muon.nesterov
        if "use_layer_wise_distributed_optimizer" in have:
            kw.update(optimizer="muon", use_layer_wise_distributed_optimizer=True)
        else:
            kw["optimizer"] = "dist_muon"
    elif optimizer != "adam":
        raise ValueError(f"optimizer={optimizer!r} is not one of ('adam', 'muon')")
    unknown = set(kw) - have
    if unknown:
        raise ValueError(
            f"megatron-core's OptimizerConfig lacks {sorted(unknown)}: unsupported megatron-core version"
        )
    return OptimizerConfig(**kw)


def ddp_config(*, kind: str, distributed: bool, overlap_grad_reduce: bool) -> Any:
    """Megatron DDP settings matching the optimizer `kind` (adamw | ours | megatron): the distributed optimizer's
    reduce-scatter only for AdamW; Megatron's legacy layer-wise Muon and ours all-reduce gradients (every rank holds
    full main grads and steps the matrices it owns)."""
    from megatron.core.distributed import DistributedDataParallelConfig

    if kind not in ("adamw", *IMPLEMENTATIONS):
        raise ValueError(f"kind={kind!r} is not one of {('adamw', *IMPLEMENTATIONS)}")
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=overlap_grad_reduce,
        use_distributed_optimizer=distributed and kind == "adamw",
        check_for_nan_in_grad=False,
    )


def fuse_torch_adam(optimizer: Any) -> int:
    """Switch every torch.optim.Adam/AdamW inside a Megatron optimizer to the fused CUDA kernel; returns how many.

    Megatron without TE/Apex builds torch's AdamW in for-each mode; fused is ~2-3x faster on the same math.
    """
    count = 0
    for inner in _inner_torch_optimizers(optimizer):
        if isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            for group in inner.param_groups:
                if all(p.is_cuda and p.dtype == torch.float32 for p in group["params"]):
                    group["fused"], group["foreach"] = True, False
            inner.defaults["fused"], inner.defaults["foreach"] = True, False
            count += 1
    return count


def _inner_torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside Megatron's wrappers, a ChainedOptimizer, MegatronLayerWise or HybridOptimizer."""
    from optim.hybrid import HybridOptimizer

    if isinstance(optimizer, MegatronLayerWise):
        inner_lw = optimizer.layerwise.inner
        return _inner_torch_optimizers(inner_lw) if inner_lw is not None else []
    if isinstance(optimizer, HybridOptimizer):
        return list(optimizer.optimizers.values())
    chained = getattr(optimizer, "chained_optimizers", None)
    if chained is not None:
        return [t for o in chained for t in _inner_torch_optimizers(o)]
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer):
        return [inner]
    return []


# ----------------------------------------------------------------------------------------------------------------
# builders
# ----------------------------------------------------------------------------------------------------------------
def build_megatron_adamw(
    model_chunks: list[Any], adamw: AdamWConfig, *, clip_grad: float, distributed: bool
) -> Any:
    """AdamW through Megatron's optimizer factory (DistributedOptimizer when `distributed`), fused kernel."""
    from megatron.core.optimizer import get_megatron_optimizer

    config = megatron_optimizer_config(
        optimizer="adam", adamw=adamw, clip_grad=clip_grad, use_distributed_optimizer=distributed
    )
    opt = get_megatron_optimizer(config, model_chunks)
    fuse_torch_adam(opt)
    return opt


def build_megatron_muon(
    model_chunks: list[Any],
    muon: MuonConfig,
    adamw: AdamWConfig,
    routing: RoutingConfig,
    *,
    clip_grad: float,
    tp_mode: str = "blockwise",
) -> Any:
    """Megatron's built-in Muon: TensorParallelMuon (emerging-optimizers) + LayerWiseDistributedOptimizer + Adam."""
    from megatron.core.optimizer import get_megatron_optimizer

    if not routing.router_to_matrix or routing.split_mla_kv_down or routing.split_gate_up:
        raise ValueError(
            f"routing={routing}: Megatron's built-in Muon always sends the router to Muon and splits only QKV"
        )
    config = megatron_optimizer_config(
        optimizer="muon",
        adamw=adamw,
        clip_grad=clip_grad,
        use_distributed_optimizer=False,
        muon=muon,
        routing=routing,
        tp_mode=tp_mode,
    )
    opt = get_megatron_optimizer(config, model_chunks, use_gloo_process_groups=False)
    fuse_torch_adam(opt)
    return opt


def _matrix_optimizer(
    groups: list[dict[str, Any]],
    cfg: MatrixConfig,
    splits: dict[torch.Tensor, RowSplit],
    tp: dict[torch.Tensor, Any] | None = None,
    tp_mode_fn: Any = None,
) -> Any:
    if isinstance(cfg, MuonConfig):
        from optim.optimizers.muon import Muon

        return Muon(groups, cfg, splits=splits, tp=tp, tp_mode_fn=tp_mode_fn)
    if isinstance(cfg, MOPConfig):
        from optim.optimizers.mop import MOP

        return MOP(groups, cfg, splits=splits, tp=tp, tp_mode_fn=tp_mode_fn)
    if isinstance(cfg, SOAPConfig):
        if tp:
            raise ValueError("tp_mode other than 'blockwise' at TP > 1: SOAP has no tensor-parallel mode")
        from optim.optimizers.soap import SOAP

        return SOAP(groups, cfg)
    raise NotImplementedError(f"no matrix optimizer for config class {type(cfg).__name__}")


def build_ours(
    model_chunks: list[Any],
    matrix: MatrixConfig,
    adamw: AdamWConfig,
    routing: RoutingConfig,
    *,
    clip_grad: float,
    tp_mode: str = "blockwise",
    tp_mode_fn: Any = None,
    layerwise: bool = True,
) -> tuple[Any, list[ParamRoute]]:
    """Our matrix optimizer + fused AdamW inside Megatron's mixed-precision wrappers, chained; returns the routes.

    TP > 1: "blockwise" orthogonalizes each TP shard alone (scale from the local shape, as MCore's blockwise);
    "duplicated" / "distributed" / "distributed_gram" / "auto" (`tp_mode_fn(rows, cols, tp, partition_dim)` picks
    per matrix) give the matrix optimizer a `TPSpec` per TP-sharded matrix (`tp_specs`: Megatron's
    `tensor_model_parallel` / `partition_dim` attributes, the expert-TP group for expert weights). With DP x CP > 1
    and `layerwise`, the layer-wise distributed optimizer (`MegatronLayerWise`) owns whole matrices per rank and
    replaces DDP's gradient all-reduce by its reduce-scatter (blockwise only at TP > 1); without `layerwise`
    every rank steps everything (replicated).
    """
    from megatron.core.optimizer import ChainedOptimizer, Float16OptimizerWithFloat16Params, FP32Optimizer

    routed = classify(model_chunks, routing)
    groups = process_groups()
    tp = tp_specs(routed, groups, tp_mode)
    dp_group = groups["dp_cp"]
    if tp and layerwise and dp_group.size() > 1:
        raise ValueError(
            f"tp_mode={tp_mode!r} at TP > 1 with the layer-wise optimizer at DP x CP > 1 is not supported; use "
            "tp_mode='blockwise' or optimizer.distributed='replicated'"
        )
    if layerwise and dp_group.size() > 1:
        return MegatronLayerWise.build(model_chunks, routed, matrix, adamw, clip_grad=clip_grad), [
            r for _, r in routed
        ]
    mat_params: list[torch.Tensor] = []
    mat_names: list[str] = []
    adam_wd: tuple[list[Any], list[Any]] = ([], [])
    splits: dict[torch.Tensor, RowSplit] = {}
    for p, r in routed:
        if r.optimizer == "matrix":
            mat_params.append(p)
            mat_names.append(r.name)
            if r.split is not None:
                splits[p] = r.split
        else:
            adam_wd[0 if r.weight_decay else 1].append((p, r.name))
    config = megatron_optimizer_config(
        optimizer="adam", adamw=adamw, clip_grad=clip_grad, use_distributed_optimizer=False
    )
    parts = []
    if mat_params:
        group = megatron_group(
            mat_params, mat_names, lr=matrix.lr, weight_decay=matrix.weight_decay, wd_mult=1.0
        )
        inner = _matrix_optimizer([group], matrix, splits, tp, tp_mode_fn)
        parts.append(_wrap_mixed_precision(inner, config, Float16OptimizerWithFloat16Params, FP32Optimizer))
        _retarget_splits(inner, mat_params)
    adam_groups: list[dict[str, Any]] = [
        megatron_group([p for p, _ in ps_], [n for _, n in ps_], lr=adamw.lr, weight_decay=wd, wd_mult=mult)
        for ps_, wd, mult in ((adam_wd[0], adamw.weight_decay, 1.0), (adam_wd[1], 0.0, 0.0))
        if ps_
    ]
    if adam_groups:
        on_cuda = all(p.is_cuda for ps_ in adam_wd for p, _ in ps_)
        fused = on_cuda if adamw.fused is None else adamw.fused
        inner = torch.optim.AdamW(
            adam_groups,
            lr=adamw.lr,
            betas=adamw.betas,
            eps=adamw.eps,
            weight_decay=adamw.weight_decay,
            fused=fused,
        )
        parts.append(_wrap_mixed_precision(inner, config, Float16OptimizerWithFloat16Params, FP32Optimizer))
    return ChainedOptimizer(parts), [r for _, r in routed]


def megatron_group(
    params: list[torch.Tensor], names: list[str], *, lr: float, weight_decay: float, wd_mult: float
) -> dict[str, Any]:
    """A param group with the keys Megatron reads: its checkpoint loader matches saved groups to current ones by
    (max_lr, min_lr, wd_mult, lr_mult, is_expert_parallel, ...), so groups that differ only in weight decay would
    collide without `wd_mult`; its LR scheduler reads max_lr / min_lr / lr_mult and multiplies wd by wd_mult."""
    return {
        "params": params,
        "param_names": names,
        "weight_decay": weight_decay,
        "wd_mult": wd_mult,
        "lr_mult": 1.0,
        "max_lr": lr,
        "min_lr": lr,
        "is_expert_parallel": False,
        "is_decoupled_lr": False,
        "default_config": True,
    }


def _wrap_mixed_precision(inner: torch.optim.Optimizer, config: Any, f16_cls: type, f32_cls: type) -> Any:
    wrapped = f16_cls(inner, config, None, None) if config.bf16 else f32_cls(inner, config, None)
    groups = process_groups()
    wrapped.grad_stats_parallel_group = _model_parallel_group()
    wrapped.tp_group = groups["tp"]
    wrapped.expert_tp_group = groups["expt_tp"]
    return wrapped


def _model_parallel_group() -> Any:
    from megatron.core import parallel_state as ps

    return ps.get_model_parallel_group()


def _retarget_splits(inner: Any, model_params: list[torch.Tensor]) -> None:
    """Megatron's Float16 wrapper replaces each bf16 parameter in the groups by an fp32 copy (`p.main_param`);
    our optimizers key fused-matrix splits by parameter identity, so move the keys to the copies."""
    from optim.optimizers.orthogonalized import OrthogonalizedOptimizer

    if not isinstance(inner, OrthogonalizedOptimizer):
        return

    def moved(old: dict[int, Any]) -> dict[int, Any]:
        return {id(getattr(p, "main_param", p)): old[id(p)] for p in model_params if id(p) in old}

    inner.splits = moved(inner.splits)
    inner.tp = moved(inner.tp)
    inner._tp_mode = moved(inner._tp_mode)


def tp_specs(
    routed: list[tuple[torch.Tensor, ParamRoute]], groups: dict[str, Any], tp_mode: str
) -> dict[torch.Tensor, Any]:
    """TPSpec of every TP-sharded matrix parameter for `tp_mode` (none for "blockwise": each shard is a matrix).

    `groups` as `process_groups()`: "tp" for dense weights, "expt_tp" for routed experts' weights; a parameter whose
    group is missing or of size 1 gets no spec."""
    from optim.optimizers.tp import TP_MODE_CHOICES, TPSpec

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


class MegatronLayerWise:
    """Our layer-wise distributed optimizer inside Megatron's training loop (the optimizer interface it calls).

    fp32 master copies of the bf16 model parameters (named like them) are handed to
    `optim.distributed.layerwise.LayerWiseDistributedOptimizer`: each step the masters take DDP's accumulated
    `main_grad`, the layer-wise optimizer reduce-scatters them to the owners (expert parameters over the expert-DP
    group), clips, steps its owned pieces (matrices whole, AdamW parameters cut element-wise) and all-gathers the
    masters; they are then copied into the bf16 model. DDP's own gradient all-reduce is switched off
    (`disable_ddp_grad_sync`), so gradients cross the network once, as a reduce-scatter.
    """

    def __init__(
        self,
        named: list[tuple[str, torch.Tensor]],
        inner_factory: Any,
        *,
        is_matrix: Any,
        is_expert: Any,
        dp_group: Any,
        expert_dp_group: Any,
        clip_grad: float,
    ) -> None:
        from optim.distributed.layerwise import LayerWiseConfig, LayerWiseDistributedOptimizer

        self.names = [n for n, _ in named]
        self.model_params = [p for _, p in named]
        self.masters = [torch.nn.Parameter(p.detach().float().clone()) for p in self.model_params]
        self.layerwise = LayerWiseDistributedOptimizer(
            zip(self.names, self.masters, strict=True),
            inner_factory,
            is_matrix=is_matrix,
            dp_group=dp_group,
            expert_dp_group=expert_dp_group,
            is_expert=is_expert,
            config=LayerWiseConfig(max_grad_norm=clip_grad),
        )

    @classmethod
    def build(
        cls,
        model_chunks: list[Any],
        routed: list[tuple[torch.Tensor, ParamRoute]],
        matrix: MatrixConfig,
        adamw: AdamWConfig,
        *,
        clip_grad: float,
    ) -> MegatronLayerWise:
        """From Megatron chunks and their routes; disables DDP's gradient sync on the chunks."""
        routes = {r.name: r for _, r in routed}

        def factory(owned: list[tuple[str, torch.Tensor]]) -> torch.optim.Optimizer:
            return _owned_optimizer(owned, routes, matrix, adamw)

        groups = process_groups()
        disable_ddp_grad_sync(model_chunks)
        return cls(
            [(r.name, p) for p, r in routed],
            factory,
            is_matrix=lambda name, p: routes[name].optimizer == "matrix",
            is_expert=lambda name: routes[name].is_expert,
            dp_group=groups["dp_cp"],
            expert_dp_group=groups["expt_dp"],
            clip_grad=clip_grad,
        )

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.layerwise.param_groups

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """bf16 training: no loss scaling."""
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Masters only; the model's main_grad buffers are zeroed by DDP's zero_grad_buffer."""
        self.layerwise.zero_grad(set_to_none)

    @torch.no_grad()
    def step(self) -> tuple[bool, None, None]:
        """Megatron's contract: (update_successful, grad_norm, num_zeros_in_grad); the norm stays inside."""
        for m, p in zip(self.masters, self.model_params, strict=True):
            g = getattr(p, "main_grad", None)
            g = g if g is not None else p.grad
            m.grad = None if g is None else g.float()  # None counts as zeros in the layer-wise sync
        self.layerwise.step()
        for m, p in zip(self.masters, self.model_params, strict=True):
            p.copy_(m)
        return True, None, None

    def state_dict(self) -> dict[str, Any]:
        """This rank's owned optimizer state and the (replicated) fp32 masters; fixed-DP checkpoints."""
        inner = self.layerwise.inner
        return {
            "inner": inner.state_dict() if inner is not None else None,
            "masters": {n: m.detach().clone() for n, m in zip(self.names, self.masters, strict=True)},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for n, m, p in zip(self.names, self.masters, self.model_params, strict=True):
                m.copy_(state["masters"][n])
                p.copy_(m)
        for d in self.layerwise.domains:
            d.copy_model_to_shards()
        if self.layerwise.inner is not None and state["inner"] is not None:
            self.layerwise.inner.load_state_dict(state["inner"])


def _owned_optimizer(
    owned: list[tuple[str, torch.Tensor]],
    routes: dict[str, ParamRoute],
    matrix: MatrixConfig,
    adamw: AdamWConfig,
) -> torch.optim.Optimizer:
    """Matrix optimizer + AdamW over this rank's owned pieces, as one torch optimizer (optim.hybrid)."""
    from optim.hybrid import HybridOptimizer

    mat = [(n, t) for n, t in owned if routes[n].optimizer == "matrix"]
    rest = [(n, t) for n, t in owned if routes[n].optimizer != "matrix"]
    opts: dict[str, torch.optim.Optimizer] = {}
    if mat:
        splits: dict[torch.Tensor, RowSplit] = {}
        for n, t in mat:
            split = routes[n].split
            if split is not None:
                splits[t] = split
        opts["matrix"] = _matrix_optimizer(
            [{"params": [t for _, t in mat], "param_names": [n for n, _ in mat]}], matrix, splits
        )
    if rest:
        groups = [
            {"params": [t for n, t in rest if routes[n].weight_decay], "weight_decay": adamw.weight_decay},
            {"params": [t for n, t in rest if not routes[n].weight_decay], "weight_decay": 0.0},
        ]
        groups = [g for g in groups if g["params"]]
        fused = all(t.is_cuda for _, t in rest) if adamw.fused is None else adamw.fused
        opts["adamw"] = torch.optim.AdamW(
            groups,
            lr=adamw.lr,
            betas=adamw.betas,
            eps=adamw.eps,
            weight_decay=adamw.weight_decay,
            fused=fused or None,
        )
    return HybridOptimizer(opts, [])


def disable_ddp_grad_sync(model_chunks: list[Any]) -> None:
    """Make Megatron DDP leave gradients local (the layer-wise optimizer reduce-scatters them itself).

    `finalize_model_grads` calls `finish_grad_sync` on every chunk; with overlap_grad_reduce off nothing else starts
    a gradient collective. Refuses chunks that overlap the reduction (their backward hooks would start one).
    """
    for chunk in model_chunks:
        ddp_cfg = getattr(chunk, "ddp_config", None)
        if ddp_cfg is not None and ddp_cfg.overlap_grad_reduce:
            raise ValueError(
                "overlap_grad_reduce=True: the layer-wise optimizer needs DDP without grad overlap"
            )
        chunk.finish_grad_sync = _no_grad_sync
        chunk.start_grad_sync = _no_grad_sync


def _no_grad_sync(*args: Any, **kwargs: Any) -> None:
    """Gradient sync left to the layer-wise optimizer."""
