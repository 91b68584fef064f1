"""One optimizer object over a model: the matrix optimizer for hidden matrices, torch AdamW for the rest.

`build_optimizer` routes named parameters (optim.routing), builds the registered matrix optimizer
(`optim.registry`) with the splits and a torch.optim.AdamW (fused on CUDA) with decay and no-decay groups, and
wraps them in HybridOptimizer, which is a torch.optim.Optimizer whose `param_groups` are the sub-optimizers' own
group dicts (LR schedulers work), with one step(), zero_grad(), state_dict() and load_state_dict().
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import torch

from optim.configs import NONFINITE_POLICIES, AdamWConfig, RoutingConfig
from optim.optimizers.base import finite_flags, handle_nonfinite, param_names
from optim.registry import build_matrix
from optim.routing import Naming, ParamRoute, SplitLayout, named_parameters, route_parameters

MatrixConfig = Any
"""The config of a registered matrix optimizer (`optim.registry.OPTIMIZERS`)."""


class HybridOptimizer(torch.optim.Optimizer):
    """Several optimizers stepping disjoint parameter sets as one.

    Args:
        optimizers: name -> optimizer ("matrix", "adamw"); order is the step order.
        routes: the routing decisions behind it (kept for reports).
        nonfinite_policy: "skip" or "raise" guards the "adamw" sub-optimizer as the matrix optimizers guard
            themselves: a parameter with a NaN/Inf gradient is left untouched that step (warned, `skip`) or the
            whole step raises `NonFiniteError` before any sub-optimizer steps (`raise`); None: unguarded (the
            all-AdamW baseline is torch's AdamW as is).
    """

    def __init__(
        self,
        optimizers: dict[str, torch.optim.Optimizer],
        routes: list[ParamRoute],
        *,
        nonfinite_policy: str | None = None,
    ) -> None:
        if not optimizers:
            raise ValueError("HybridOptimizer needs at least one optimizer")
        if nonfinite_policy not in (None, *NONFINITE_POLICIES):
            raise ValueError(
                f"nonfinite_policy={nonfinite_policy!r} is not one of {(None, *NONFINITE_POLICIES)}"
            )
        self.optimizers = optimizers
        self.routes = routes
        self.nonfinite_policy = nonfinite_policy
        self.nonfinite_events: list[tuple[str, int, str]] = []
        """Every (parameter name, step, "grad") of the AdamW side whose update was skipped or raised."""
        self._num_skipped_adamw = 0
        self._num_steps = 0
        params = [p for opt in optimizers.values() for g in opt.param_groups for p in g["params"]]
        self._own_groups: list[dict[str, Any]] | None = []  # used only while the base class initialises
        super().__init__(params, {})
        self._own_groups = None

    @property
    def num_skipped_updates(self) -> int:
        """Parameter updates skipped for a NaN/Inf (nonfinite_policy="skip"): the AdamW side's and the matrix
        optimizer's (torch's AdamW skips none itself)."""
        subs = sum(getattr(opt, "num_skipped_updates", 0) for opt in self.optimizers.values())
        return self._num_skipped_adamw + subs

    # `param_groups` and `state` are views of the sub-optimizers' (load_state_dict replaces their objects), so
    # LR schedulers and per-group edits reach them; the base class's own assignments are dropped.
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        if self._own_groups is not None:
            return self._own_groups
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        if self._own_groups is not None:
            self._own_groups = value

    @property  # type: ignore[override]
    def state(self) -> ChainMap[Any, Any]:
        return ChainMap(*(opt.state for opt in self.optimizers.values()))

    @state.setter
    def state(self, value: Any) -> None:
        pass

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Evaluates `closure` once (with grad), then steps every sub-optimizer."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        held = self._hold_nonfinite_adamw_grads()
        try:
            for opt in self.optimizers.values():
                opt.step()
        finally:
            for p, g in held:
                p.grad = g
        self._num_steps += 1
        return loss

    def _hold_nonfinite_adamw_grads(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Under a policy, the AdamW side's non-finite gradients: raise, or detach them for this step (torch's
        AdamW skips a parameter whose grad is None) and return them to put back. One host sync."""
        adamw = self.optimizers.get("adamw")
        if self.nonfinite_policy is None or adamw is None:
            return []
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = [
            (p, p.grad) for g in adamw.param_groups for p in g["params"] if p.grad is not None
        ]
        flags = finite_flags(grad for _, grad in pairs)
        held = [pair for pair, ok in zip(pairs, flags) if not ok]
        if not held:
            return []
        names = param_names(adamw.param_groups)
        events = [(names[id(p)], self._num_steps + 1, "grad") for p, _ in held]
        self._num_skipped_adamw += handle_nonfinite(events, self.nonfinite_policy, self.nonfinite_events)
        for p, _ in held:
            p.grad = None
        return held

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if set(state_dict) != set(self.optimizers):
            raise ValueError(f"state_dict keys {sorted(state_dict)} != optimizers {sorted(self.optimizers)}")
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state_dict[name])

    def summary(self) -> dict[str, int]:
        """Number of parameters per (optimizer, kind), e.g. {"matrix/expert_stack": 48, ...}."""
        out: dict[str, int] = {}
        for r in self.routes:
            key = f"{r.optimizer}/{r.kind}"
            out[key] = out.get(key, 0) + 1
        return out


def _adamw(
    config: AdamWConfig, decay: list[tuple[str, torch.Tensor]], no_decay: list[tuple[str, torch.Tensor]]
) -> torch.optim.AdamW:
    groups = [
        {"params": ps, "weight_decay": wd} for ps, wd in ((decay, config.weight_decay), (no_decay, 0.0)) if ps
    ]
    all_cuda = all(p.is_cuda for g in groups for _, p in g["params"])  # type: ignore[attr-defined]
    fused = all_cuda if config.fused is None else config.fused
    return torch.optim.AdamW(
        groups,
        lr=config.lr,
        betas=config.betas,
        eps=config.eps,
        weight_decay=config.weight_decay,
        fused=fused or None,
    )


def build_optimizer(
    named_params: Iterable[tuple[str, torch.Tensor]] | Iterable[torch.Tensor] | torch.nn.Module,
    config: MatrixConfig | AdamWConfig,
    *,
    naming: Naming = "hf",
    routing: RoutingConfig | None = None,
    layout: SplitLayout | None = None,
    adamw: AdamWConfig | None = None,
    model: torch.nn.Module | None = None,
) -> HybridOptimizer:
    """Route `named_params` and build the optimizer.

    Args:
        named_params: the model (embeddings and output head found by module type), e.g.
            `model.named_parameters()`, or plain tensors; parameters without requires_grad are left out.
        config: the matrix optimizer's config, or AdamWConfig for the all-AdamW baseline.
        naming: "hf" (transformers) or "megatron" parameter names.
        routing: routing and split policy.
        layout: model dimensions the requested splits need.
        adamw: config of the AdamW side; default AdamWConfig with the matrix config's lr and weight_decay.
        model: the model `named_params` belong to (a subset, e.g. one rank's share), to route by module type.

    Returns:
        HybridOptimizer with sub-optimizers "matrix" (absent for the baseline or without matrices) and "adamw".
    """
    pairs, own = named_parameters(named_params)
    named = [(n, p) for n, p in pairs if p.requires_grad]
    by_name = dict(named)
    routes = route_parameters(named, naming=naming, routing=routing, layout=layout, model=model or own)
    if isinstance(config, AdamWConfig):
        routes = [replace(r, optimizer="adamw", split=None) for r in routes]
        adamw_cfg, matrix_routes, adamw_routes = config, [], routes
    else:
        adamw_cfg = adamw or AdamWConfig(lr=config.lr, weight_decay=config.weight_decay)
        matrix_routes = [r for r in routes if r.optimizer == "matrix"]
        adamw_routes = [r for r in routes if r.optimizer == "adamw"]
    optimizers: dict[str, torch.optim.Optimizer] = {}
    if matrix_routes:
        assert not isinstance(config, AdamWConfig)
        splits = {by_name[r.name]: r.split for r in matrix_routes if r.split is not None}
        optimizers["matrix"] = build_matrix(
            [(r.name, by_name[r.name]) for r in matrix_routes], config, splits=splits
        )
    if adamw_routes:
        decay = [(r.name, by_name[r.name]) for r in adamw_routes if r.decay]
        no_decay = [(r.name, by_name[r.name]) for r in adamw_routes if not r.decay]
        optimizers["adamw"] = _adamw(adamw_cfg, decay, no_decay)
    policy = None if isinstance(config, AdamWConfig) else config.nonfinite_policy
    return HybridOptimizer(optimizers, routes, nonfinite_policy=policy)
