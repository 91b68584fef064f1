"""Our layer-wise distributed optimizer inside Megatron's training loop (`MegatronLayerWise`), and switching off
Megatron DDP's gradient sync it replaces."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from optim.configs import AdamWConfig
from optim.functional.split import RowSplit
from optim.megatron.config import MatrixConfig, megatron_group, process_groups
from optim.megatron.routing import ParamRoute
from optim.registry import build_matrix


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
        config: Any = None,
    ) -> None:
        from optim.distributed.layerwise import LayerWiseConfig, LayerWiseDistributedOptimizer

        config = LayerWiseConfig() if config is None else config
        for name in ("overlap_param_gather", "overlap_grad_reduce"):
            if getattr(config, name):
                raise ValueError(
                    f"{name}=True: the Megatron adapter's layer-wise optimizer steps fp32 master copies after "
                    "the backward and gathers them at the step (no hooks on the model); allowed: False"
                )
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
            config=dataclasses.replace(config, max_grad_norm=clip_grad),
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
        config: Any = None,
    ) -> MegatronLayerWise:
        """From Megatron chunks and their routes; disables DDP's gradient sync on the chunks. `config`: the
        `LayerWiseConfig` (assignment, gradient sync, collective, bucket size; None = its defaults)."""
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
            config=config,
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
    """Matrix optimizer + AdamW over this rank's owned pieces, as one torch optimizer (optim.hybrid).

    Groups carry every key Megatron's scheduler and checkpoint loader and Megatron-Bridge's training log read
    (`megatron_group`), as the replicated path's do."""
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
        group = megatron_group(
            [t for _, t in mat],
            [n for n, _ in mat],
            lr=matrix.lr,
            weight_decay=matrix.weight_decay,
            wd_mult=1.0,
        )
        opts["matrix"] = build_matrix([group], matrix, splits=splits)
    if rest:
        decay = [(n, t) for n, t in rest if routes[n].weight_decay]
        no_decay = [(n, t) for n, t in rest if not routes[n].weight_decay]
        groups = [
            megatron_group([t for _, t in ps], [n for n, _ in ps], lr=adamw.lr, weight_decay=wd, wd_mult=mult)
            for ps, wd, mult in ((decay, adamw.weight_decay, 1.0), (no_decay, 0.0, 0.0))
            if ps
        ]
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
