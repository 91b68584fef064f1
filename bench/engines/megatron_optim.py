"""Optimizer side of the megatron engine: our optimizer config -> `optim` configs -> a Megatron optimizer, plus NS timing hooks.

`build(cfg, model_chunks, timer)` picks, from `cfg.optimizer`:
- adamw                      -> Megatron DistributedOptimizer (torch fused AdamW inside) [optim.megatron]
- muon/mop/soap_rekls, ours  -> our optimizer + fused AdamW in Megatron's mixed-precision wrappers [optim.megatron]
- muon, megatron             -> Megatron's TensorParallelMuon + LayerWiseDistributedOptimizer [optim.megatron]
and wraps the orthogonalize calls with `timer` so Newton-Schulz time and FLOPs are measured per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.timing import ns_flops_plain
from muonbench.schema import RootConfig, layerwise_fields, optim_configs
from optim import registry

DISTRIBUTED_OPTIMIZER_NOTE = (
    "adamw: Megatron DistributedOptimizer (reduce-scatter grads, all-gather params); matrix optimizers: gradients "
    "all-reduced, layer-wise ownership (moot at DP=1)"
)


@dataclass(kw_only=True, slots=True)
class BuiltOptimizer:
    """The Megatron optimizer plus facts for the run record."""

    optimizer: Any
    kind: str
    """adamw | ours | megatron."""
    num_ns_steps: int = 0
    routes: list[Any] = field(default_factory=list)
    """optim.megatron.ParamRoute of every parameter (ours)."""

    def tp_modes(self) -> dict[str, str]:
        """Parameter name -> TP mode of our matrix optimizer's TP-sharded matrices ("auto" ones resolve at the
        first step, so read this after it); empty for blockwise, TP = 1 and the other kinds."""
        from optim.optimizers.orthogonalized import OrthogonalizedOptimizer

        if self.kind != "ours":
            return {}
        out: dict[str, str] = {}
        for inner in _inner(self.optimizer):
            if isinstance(inner, OrthogonalizedOptimizer):
                out.update(inner.tp_modes)
        return out


def implementation(cfg: RootConfig) -> str:
    """adamw | ours | megatron, validated against what the engine can build."""
    opt = cfg.optimizer
    if not registry.spec(opt.name).matrix:
        return "adamw"
    if opt.implementation not in ("ours", "megatron"):
        raise ValueError(
            f"optimizer.implementation={opt.implementation!r}: the megatron engine runs 'ours' or 'megatron'"
        )
    if opt.implementation == "megatron" and opt.name != "muon":
        raise ValueError(f"optimizer.name={opt.name!r} with implementation='megatron': only muon is built in")
    return opt.implementation


ADAMW_DISTRIBUTED = True
"""The engine's AdamW runs in Megatron's DistributedOptimizer."""


def megatron_muon_tp_mode(cfg: RootConfig) -> str:
    """The TP mode of Megatron's built-in Muon: TensorParallelMuon has no per-matrix choice, so "auto" runs its
    blockwise mode."""
    tp_mode = cfg.parallelism.distribution.tp_mode
    return tp_mode if tp_mode != "auto" else "blockwise"


def megatron_config(cfg: RootConfig) -> Any | None:
    """The Megatron OptimizerConfig `build` hands Megatron for AdamW or Megatron's Muon; None for ours."""
    from optim import megatron as om

    kind = implementation(cfg)
    matrix, routing, adamw = optim_configs(cfg.optimizer)
    clip = cfg.optimizer.clip_grad
    if kind == "adamw":
        return om.megatron_adamw_config(adamw, clip_grad=clip, distributed=ADAMW_DISTRIBUTED)
    if kind == "megatron":
        return om.megatron_muon_config(
            matrix, adamw, routing, clip_grad=clip, tp_mode=megatron_muon_tp_mode(cfg)
        )
    return None


def build(cfg: RootConfig, model_chunks: list[Any], timer: Any) -> BuiltOptimizer:
    """The Megatron optimizer for `cfg.optimizer` over the DDP-wrapped `model_chunks`; NS calls timed by `timer`."""
    from optim import megatron as om

    kind = implementation(cfg)
    matrix, routing, adamw = optim_configs(cfg.optimizer)
    clip = cfg.optimizer.clip_grad
    if kind == "adamw":
        opt = om.build_megatron_adamw(model_chunks, adamw, clip_grad=clip, distributed=ADAMW_DISTRIBUTED)
        return BuiltOptimizer(optimizer=opt, kind=kind)
    tp_mode = cfg.parallelism.distribution.tp_mode
    if kind == "megatron":
        opt = om.build_megatron_muon(
            model_chunks, matrix, adamw, routing, clip_grad=clip, tp_mode=megatron_muon_tp_mode(cfg)
        )
        _time_megatron_muon(opt, timer, matrix.num_ns_steps)
        return BuiltOptimizer(optimizer=opt, kind=kind, num_ns_steps=matrix.num_ns_steps)
    opt, routes = om.build_ours(
        model_chunks,
        matrix,
        adamw,
        routing,
        clip_grad=clip,
        tp_mode=tp_mode,
        tp_mode_fn=tp_mode_fn(cfg) if tp_mode == "auto" else None,
        layerwise=cfg.parallelism.distribution.distributed == "layerwise",
        layerwise_config=layerwise_config(cfg),
    )
    num_ns_steps = getattr(matrix, "num_ns_steps", 0)
    _time_ours(opt, timer, num_ns_steps)
    return BuiltOptimizer(optimizer=opt, kind=kind, num_ns_steps=num_ns_steps, routes=routes)


def layerwise_config(cfg: RootConfig) -> Any:
    """The layer-wise optimizer's config: every `parallelism.distribution` field it has
    (`muonbench.schema.layerwise_fields`); `build_ours` adds the clipping."""
    from optim.distributed.layerwise import LayerWiseConfig

    return LayerWiseConfig(**layerwise_fields(cfg.parallelism.distribution))


def tp_mode_fn(cfg: RootConfig) -> Any:
    """`tp_mode=auto`: the optimizer cost model's per-matrix choice (`optim.cost.choose_tp_mode`) on
    `cfg.hardware`'s bf16 peak and TP links."""
    from optim import cost

    hw = cfg.hardware
    rate = hw.peak_bf16_tflops * 1e12 * cost.GEMM_CEILING_FRACTION

    def pick(rows: int, cols: int, tp: int, partition_dim: int) -> str:
        link = cost.group_link(
            tp,
            nvlink_gbps=hw.nvlink_gbps,
            nvlink_domain=hw.nvlink_domain,
            network_gbps=hw.network_gbps,
            nvlink_latency_us=hw.nvlink_latency_us,
            network_latency_us=hw.network_latency_us,
        )
        return cost.choose_tp_mode(rows, cols, tp, flops_per_s=rate, link=link, partition_dim=partition_dim)

    return pick


def _inner(opt: Any) -> list[Any]:
    from optim.megatron import _inner_torch_optimizers

    return _inner_torch_optimizers(opt)


def _time_ours(opt: Any, timer: Any, num_ns_steps: int) -> None:
    """Time every batched orthogonalize call of our matrix optimizer; count plain NS FLOPs from its (B, m, n)."""
    from optim.optimizers.orthogonalized import OrthogonalizedOptimizer

    for inner in _inner(opt):
        if isinstance(inner, OrthogonalizedOptimizer):
            # TP shards count the FLOPs of the local shape: what distributed NS computes, less than duplicated
            count = (
                (lambda x, **kw: ns_flops_plain(x.shape[-2], x.shape[-1], num_ns_steps, batch=x.shape[0]))
                if num_ns_steps
                else None
            )
            inner.instrument(lambda fn, phase, count=count: timer.wrap(fn, phase, count=count))


def _time_megatron_muon(opt: Any, timer: Any, num_ns_steps: int) -> None:
    """Time every per-matrix `scaled_orthogonalize_fn` call of Megatron's TensorParallelMuon (QKV pieces included)."""
    for inner in _inner(opt):
        fn = getattr(inner, "scaled_orthogonalize_fn", None)
        if fn is not None:
            inner.scaled_orthogonalize_fn = timer.wrap(
                fn,
                "ns",
                count=lambda grad, *a, **kw: ns_flops_plain(grad.shape[-2], grad.shape[-1], num_ns_steps),
            )
