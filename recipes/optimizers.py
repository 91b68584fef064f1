"""Optimizer delta of a Bridge recipe: AdamW, Muon, MOP, SOAP-REKLS; Megatron's built-in or ours (pure data).

`optimizer.implementation` picks who steps the matrices:
- "megatron": Megatron-Core's own optimizer, named in the `optimizer` section (AdamW -> distributed fused "adam";
  Muon -> "dist_muon", TensorParallelMuon on the layer-wise distributed optimizer, as MB's Kimi recipe; SOAP ->
  "dist_soap"). Knobs that MCore cannot express raise a ValueError naming them instead of being dropped.
- "ours": the `optim.megatron` adapter builds our optimizer through Bridge's duck-typed
  `OptimizerConfig.provide()` seam; the `optimizer` section then only carries what the scalar AdamW and the
  scheduler read. DDP runs without Megatron's distributed optimizer. With `parallelism.distribution.distributed=
  "layerwise"` and DP x CP > 1
  our layer-wise distributed optimizer (`optim.megatron.MegatronLayerWise`) owns whole matrices per rank and
  replaces DDP's gradient all-reduce by its own reduce-scatter, so DDP must not overlap a gradient reduction
  (`ddp.overlap_grad_reduce` and `comm_overlap.overlap_grad_reduce` are set False); its parameter all-gather is
  its own, in bf16. With `distributed="none"` every rank steps everything on DDP's all-reduced gradients.
  The run metadata records what is applied (`ours_distribution`) and which schema fields the adapter does not read.
"""

from __future__ import annotations

from typing import Any

from muonbench.schema import (
    LAYERWISE_FIELDS,
    DistributionConfig,
    MatrixOptimizerSchema,
    PrecisionConfig,
    optim_configs,
)
from optim import registry
from optim.configs import ConfigFieldError
from recipes.models import Sections

FAIR_PROFILE: dict[str, bool] = {"overlap_param_gather": True, "fp8_param_gather": True}
"""ab_mode="fair": one setting for every optimizer (fp8_param_gather only where the precision has an FP8 recipe)."""


def _fail(name: str, value: Any, rule: str) -> None:
    raise ValueError(f"optimizer.{name}={value!r}: {rule}")


def _fail_dist(name: str, value: Any, rule: str) -> None:
    raise ValueError(f"parallelism.distribution.{name}={value!r}: {rule}")


def _common(opt: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Optimizer and scheduler fields every algorithm shares (LR schedule, weight decay, clip, scalar AdamW)."""
    wd = opt.weight_decay
    optimizer = {
        "lr": opt.lr,
        "min_lr": opt.min_lr,
        "weight_decay": wd,
        "clip_grad": opt.clip_grad,
        "adam_beta1": opt.adam_beta1,
        "adam_beta2": opt.adam_beta2,
        "adam_eps": opt.adam_eps,
        "use_precision_aware_optimizer": False,
    }
    scheduler = {
        "lr_decay_style": opt.lr_decay,
        "lr_warmup_iters": opt.lr_warmup_steps,
        "lr_warmup_init": 0.0,
        "start_weight_decay": wd,
        "end_weight_decay": wd,
        "weight_decay_incr_style": "constant",
        "override_opt_param_scheduler": True,
    }
    return optimizer, scheduler


def _megatron_distribution_checks(dist: DistributionConfig) -> None:
    """The distribution Megatron's layer-wise path runs (other settings would change the run silently)."""
    if dist.grad_sync != "all_reduce":
        _fail_dist(
            "grad_sync",
            dist.grad_sync,
            "Megatron's layer-wise path (as run by Megatron-Bridge) all-reduces gradients; use all_reduce or "
            "implementation=ours",
        )
    if dist.distributed == "layerwise" and dist.assignment != "ping_pong_numel":
        _fail_dist(
            "assignment",
            dist.assignment,
            "Megatron's layer-wise path deals parameters ping-pong by numel; use ping_pong_numel or "
            "implementation=ours",
        )


def _mcore(fn: Any, *args: Any) -> Any:
    """`fn(*args)` of the one Megatron-core adapter (`optim.megatron.config`), its errors named by config path."""
    try:
        return fn(*args)
    except ConfigFieldError as exc:
        path = "parallelism.distribution" if exc.field == "tp_mode" else "optimizer"
        raise ValueError(f"{path}.{exc.field}={exc.value!r}: {exc.rule}") from exc


def _megatron(opt: Any, dist: DistributionConfig) -> dict[str, Any]:
    """Megatron-Core's own implementation of `opt` (the registry's `to_megatron`: the same adapter the megatron
    engine uses), on the layer-wise distributed optimizer when `dist.distributed` is layerwise."""
    entry = registry.spec(opt.name)
    if not entry.to_megatron:
        _fail("implementation", opt.implementation, f"{entry.no_megatron}; use ours")
    algo, routing, adamw = optim_configs(opt)
    section = _mcore(registry.load(entry.to_megatron), algo, routing, adamw, dist.tp_mode)
    _megatron_distribution_checks(dist)
    if dist.distributed == "layerwise":
        section["optimizer"] = f"dist_{section['optimizer']}"
    return section


def _algorithm(opt: Any, dist: DistributionConfig) -> tuple[dict[str, Any], str, bool]:
    """(optimizer fields, bridge implementation, state sharded by the distributed optimizer)."""
    impl = opt.implementation
    if impl == "eo":
        _fail("implementation", impl, "Emerging-Optimizers is the test oracle only; use megatron or ours")
    if getattr(opt, "ns_overlap", False):
        _fail(
            "ns_overlap",
            True,
            "engine=megatron only: Megatron-Bridge's training loop has no hook to start it",
        )
    if not registry.spec(opt.name).matrix:
        if impl == "ours":
            _fail(
                "implementation", impl, "AdamW runs as Megatron's distributed fused Adam (torch or megatron)"
            )
        return {"optimizer": "adam"}, "megatron", True
    if impl == "ours":
        # Scalar AdamW and the schedule; the adapter replaces the matrix part (replicated, all-reduced grads).
        return {"optimizer": "adam"}, "ours", False
    return _megatron(opt, dist), "megatron", False


def ab_knobs(
    opt: Any,
    dist: DistributionConfig,
    precision: PrecisionConfig,
    ab_mode: str,
    *,
    gathers_params: bool = True,
) -> tuple[dict[str, bool], dict[str, bool]]:
    """(knobs used, configured values they replaced) for param-gather overlap and FP8 param gather.

    `gathers_params` False (our replicated adapter): no parameter all-gather exists, both knobs are off.
    """
    configured = {
        # AdamW has no knob: MB's AdamW always overlaps the distributed optimizer's param all-gather.
        "overlap_param_gather": dist.overlap_param_gather if isinstance(opt, MatrixOptimizerSchema) else True,
        "fp8_param_gather": bool(precision.fp8_recipe) and precision.fp8_param_gather,
    }
    if not gathers_params:
        off = {"overlap_param_gather": False, "fp8_param_gather": False}
        return off, {k: v for k, v in configured.items() if off[k] != v}
    if ab_mode == "published":
        return configured, {}
    fair = {
        "overlap_param_gather": FAIR_PROFILE["overlap_param_gather"],
        "fp8_param_gather": bool(precision.fp8_recipe) and FAIR_PROFILE["fp8_param_gather"],
    }
    return fair, {k: v for k, v in configured.items() if fair[k] != v}


def apply_optimizer(
    sections: Sections, opt: Any, dist: DistributionConfig, precision: PrecisionConfig, *, ab_mode: str
) -> dict[str, Any]:
    """Optimizer, scheduler and DDP fields of `opt` distributed as `dist` (`parallelism.distribution`); returns the
    run metadata of the optimizer and the A/B mode."""
    optimizer, scheduler = _common(opt)
    algo, bridge_impl, dist_opt = _algorithm(opt, dist)
    optimizer |= algo
    knobs, replaced = ab_knobs(opt, dist, precision, ab_mode, gathers_params=bridge_impl == "megatron")
    optimizer |= {
        "use_distributed_optimizer": dist_opt,
        "overlap_param_gather": knobs["overlap_param_gather"],
    }
    sections.setdefault("optimizer", {}).update(optimizer)
    sections.setdefault("scheduler", {}).update(scheduler)
    sections.setdefault("ddp", {}).update(
        use_distributed_optimizer=dist_opt, overlap_param_gather=knobs["overlap_param_gather"]
    )
    if precision.fp8_recipe:
        sections.setdefault("mixed_precision", {}).update(
            fp8_param_gather=knobs["fp8_param_gather"],
            # Bridge requires reuse_grad_buf_for_mxfp8_param_ag == fp8_param_gather under MXFP8.
            reuse_grad_buf_for_mxfp8_param_ag=knobs["fp8_param_gather"] and precision.fp8_recipe == "mxfp8",
        )
    requires = {}
    if ab_mode == "fair" and bridge_impl == "megatron" and not dist_opt:
        requires["megatron-core"] = ">=0.19"  # layer-wise overlapped param gather; MXFP8 param gather (#5707)
    ours: dict[str, Any] = {}
    not_applied: dict[str, Any] = {}
    if bridge_impl == "ours":
        ours, not_applied = _ours_distribution(sections, dist)
    return {
        "optimizer": {
            "name": opt.name,
            "implementation": opt.implementation,
            "bridge_impl": bridge_impl,
            "megatron_optimizer": optimizer["optimizer"],
            "distributed_optimizer": dist_opt,
            "ours_distribution": ours,
            "not_applied": not_applied,
        },
        "ab_knobs": knobs,
        "ab_replaced": replaced,
        "requires": requires,
    }


def _ours_distribution(sections: Sections, dist: DistributionConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what our adapter applies, `parallelism.distribution` fields it does not read) for
    `optimizer.implementation=ours`.

    Layer-wise: DDP's overlapped gradient reduction is switched off (the layer-wise optimizer reduce-scatters the
    gradients itself, `optim.megatron.disable_ddp_grad_sync`). At DP x CP = 1 the layer-wise optimizer is the
    replicated one (one owner), which `build_ours` builds directly.
    """
    if dist.distributed == "layerwise":
        sections.setdefault("ddp", {})["overlap_grad_reduce"] = False
        sections.setdefault("comm_overlap", {})["overlap_grad_reduce"] = False
        # the adapter builds its LayerWiseConfig from these (`layerwise_fields`, `recipes.bridge`)
        return {"distributed": "layerwise", **{k: getattr(dist, k) for k in LAYERWISE_FIELDS}}, {}
    applied = {"distributed": "none", "grad_sync": "all_reduce", "assignment": None}
    differs = {
        k: getattr(dist, k) for k in ("grad_sync", "assignment") if applied[k] not in (None, getattr(dist, k))
    }
    return applied, differs
