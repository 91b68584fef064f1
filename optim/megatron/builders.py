"""The three optimizer builders (`build_ours`, `build_megatron_muon`, `build_megatron_adamw`) and their helpers:
Megatron's mixed-precision wrappers around our optimizers, torch fused Adam inside Megatron's optimizers. Each
builder first swaps Megatron's per-tensor multi-tensor fallbacks (no TE / Apex) for foreach kernels
(`optim.megatron.multi_tensor`), for all three alike."""

from __future__ import annotations

from typing import Any

import torch

from optim.configs import AdamWConfig, MuonConfig, RoutingConfig
from optim.functional.split import RowSplit
from optim.megatron import multi_tensor
from optim.megatron.config import (
    MatrixConfig,
    _model_parallel_group,
    megatron_group,
    megatron_optimizer_config,
    process_groups,
)
from optim.megatron.layerwise import MegatronLayerWise
from optim.megatron.routing import ParamRoute, classify, tp_specs
from optim.registry import build_matrix


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


def megatron_adamw_config(adamw: AdamWConfig, *, clip_grad: float, distributed: bool) -> Any:
    """The OptimizerConfig `build_megatron_adamw` hands Megatron."""
    return megatron_optimizer_config(
        optimizer="adam", adamw=adamw, clip_grad=clip_grad, use_distributed_optimizer=distributed
    )


def megatron_muon_config(
    muon: MuonConfig,
    adamw: AdamWConfig,
    routing: RoutingConfig,
    *,
    clip_grad: float,
    tp_mode: str = "blockwise",
) -> Any:
    """The OptimizerConfig `build_megatron_muon` hands Megatron; ValueError for a setting it cannot follow."""
    return megatron_optimizer_config(
        optimizer="muon",
        adamw=adamw,
        clip_grad=clip_grad,
        use_distributed_optimizer=False,
        muon=muon,
        routing=routing,
        tp_mode=tp_mode,
    )


def build_megatron_adamw(
    model_chunks: list[Any], adamw: AdamWConfig, *, clip_grad: float, distributed: bool
) -> Any:
    """AdamW through Megatron's optimizer factory (DistributedOptimizer when `distributed`), fused kernel."""
    from megatron.core.optimizer import get_megatron_optimizer

    multi_tensor.install()
    opt = get_megatron_optimizer(
        megatron_adamw_config(adamw, clip_grad=clip_grad, distributed=distributed), model_chunks
    )
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

    multi_tensor.install()
    config = megatron_muon_config(muon, adamw, routing, clip_grad=clip_grad, tp_mode=tp_mode)
    opt = get_megatron_optimizer(config, model_chunks, use_gloo_process_groups=False)
    fuse_torch_adam(opt)
    return opt


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
    layerwise_config: Any = None,
    bf16: bool = True,
) -> tuple[Any, list[ParamRoute]]:
    """Our matrix optimizer + fused AdamW inside Megatron's mixed-precision wrappers, chained; returns the routes.

    TP > 1: "blockwise" orthogonalizes each TP shard alone (scale from the local shape, as MCore's blockwise);
    "duplicated" / "distributed" / "distributed_gram" / "auto" (`tp_mode_fn(rows, cols, tp, partition_dim)` picks
    per matrix) give the matrix optimizer a `TPSpec` per TP-sharded matrix (`tp_specs`: Megatron's
    `tensor_model_parallel` / `partition_dim` attributes, the expert-TP group for expert weights). With DP x CP > 1
    and `layerwise`, the layer-wise distributed optimizer (`MegatronLayerWise`) owns whole matrices per rank and
    replaces DDP's gradient all-reduce by its reduce-scatter (blockwise only at TP > 1); without `layerwise`
    every rank steps everything (replicated); `layerwise_config` is the layer-wise optimizer's `LayerWiseConfig`
    (None: its defaults; its overlap switches are refused, `MegatronLayerWise`). `bf16`: the model's parameters are bf16 (Megatron's Float16 wrapper
    keeps fp32 masters); False: fp32 parameters stepped in place (Megatron's FP32Optimizer).
    """
    from megatron.core.optimizer import Float16OptimizerWithFloat16Params, FP32Optimizer

    multi_tensor.install()
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
        built = MegatronLayerWise.build(
            model_chunks, routed, matrix, adamw, clip_grad=clip_grad, config=layerwise_config
        )
        return built, [
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
        optimizer="adam", adamw=adamw, clip_grad=clip_grad, use_distributed_optimizer=False, bf16=bf16
    )
    parts = []
    targets: list[Any] = []
    if mat_params:
        group = megatron_group(
            mat_params, mat_names, lr=matrix.lr, weight_decay=matrix.weight_decay, wd_mult=1.0
        )
        inner = build_matrix([group], matrix, splits=splits, tp=tp, tp_mode_fn=tp_mode_fn)
        parts.append(_wrap_mixed_precision(inner, config, Float16OptimizerWithFloat16Params, FP32Optimizer))
        _retarget_splits(inner, mat_params)
        if hasattr(inner, "assume_finite_grads") and _in_main_grad_norm(mat_params):
            targets.append(inner)
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
    return finite_norm_chain(parts, targets, clip_grad=clip_grad), [r for _, r in routed]


def _in_main_grad_norm(params: list[torch.Tensor]) -> bool:
    """No parameter is in a separate Megatron grad-norm group (those are excluded from the main norm)."""
    import megatron.core.optimizer.optimizer as mopt

    group_of = getattr(mopt, "_get_param_grad_norm_group", None)
    separate = getattr(mopt, "_is_separate_grad_norm_group", None)
    if group_of is None or separate is None:  # megatron-core without grad-norm groups
        return True
    return not any(separate(group_of(p)) for p in params)


def vouch_finite(norm: Any, targets: list[Any]) -> bool:
    """Tell each target (`Muon.assume_finite_grads`) that this step's gradients are finite when
    Megatron's global gradient norm `norm` is a finite float (a finite 2-norm bounds every element). A tensor norm
    (Transformer Engine's sync-free path) is not read: that would add the host sync the hint saves."""
    import math

    if isinstance(norm, int | float) and math.isfinite(norm):
        for t in targets:
            t.assume_finite_grads()
        return True
    return False


def confirm_unclipped(norm: Any, targets: list[Any], clip_grad: float) -> bool:
    """Tell each target (`Muon.confirm_speculation`) that the gradients its speculative NS read
    are this step's unchanged: Megatron's global norm `norm` is a finite float and clipping will not scale them
    (`clip_grad <= 0`, or Megatron's coefficient `clip_grad / (norm + 1e-6)` is >= 1). A tensor norm is not read
    (no host sync is added); then nothing is confirmed and the step recomputes."""
    import math

    if not (isinstance(norm, int | float) and math.isfinite(norm)):
        return False
    if clip_grad > 0.0 and clip_grad / (norm + 1.0e-6) < 1.0:
        return False
    for t in targets:
        t.confirm_speculation()
    return True


def finite_norm_chain(parts: list[Any], targets: list[Any], *, clip_grad: float = 0.0) -> Any:
    """Megatron's ChainedOptimizer whose `get_grad_norm` (called by `step()` before any sub-optimizer steps, after
    the main grads are in place, before clipping) passes a finite global norm on to our matrix optimizers
    (`vouch_finite`), so their fused step skips its own gradient screen and host sync, and confirms their
    speculative NS when clipping will not change the gradients (`confirm_unclipped`, `optim.megatron.overlap`)."""
    from megatron.core.optimizer import ChainedOptimizer

    class FiniteNormChain(ChainedOptimizer):  # type: ignore[misc]
        def get_grad_norm(self) -> Any:
            norm = super().get_grad_norm()
            vouch_finite(norm, self.finite_targets)
            confirm_unclipped(norm, self.finite_targets, self.clip_grad)
            return norm

    chain = FiniteNormChain(parts)
    chain.finite_targets = list(targets)
    chain.clip_grad = float(clip_grad)
    return chain


def _wrap_mixed_precision(inner: torch.optim.Optimizer, config: Any, f16_cls: type, f32_cls: type) -> Any:
    wrapped = f16_cls(inner, config, None, None) if config.bf16 else f32_cls(inner, config, None)
    groups = process_groups()
    wrapped.grad_stats_parallel_group = _model_parallel_group()
    wrapped.tp_group = groups["tp"]
    wrapped.expert_tp_group = groups["expt_tp"]
    return wrapped


def _retarget_splits(inner: Any, model_params: list[torch.Tensor]) -> None:
    """Megatron's Float16 wrapper replaces each bf16 parameter in the groups by an fp32 copy (`p.main_param`);
    our optimizers key fused-matrix splits by parameter identity, so move the keys to the copies."""
    from optim.optimizers.orthogonalized import OrthogonalizedOptimizer

    if not isinstance(inner, OrthogonalizedOptimizer):
        return

    inner.rekey([(p, getattr(p, "main_param", p)) for p in model_params])
