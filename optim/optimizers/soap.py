"""SOAP with the REKLS variant (emerging-optimizers 0.3.0 `SOAP` / `REKLS` semantics).

Per parameter and step t (1-based), on fp32 copies, batched over the experts of a 3-D stack:

1. beta_t = 1 - (1 - beta) / (1 - beta^t) (shampoo-beta bias correction), L, R <- lerp(stat, 1 - beta_t) with
   Shampoo statistics or KL-Shampoo ones (which use the previous basis) -- "realtime": the current gradient is
   folded in before the basis refresh.
2. Every `precondition_frequency` steps (and at t = 1): exp_avg back to the parameter basis, old bases sorted
   by diag(Q^T F Q) (exp_avg_sq permuted to match), new bases by eigh (REKLS, and always at t = 1) or by
   `power_iter_steps` QR power steps (SOAP), exp_avg into the new basis.
3. Decoupled weight decay; Adam on Q_L^T G Q_R with bias correction; p -= lr Q_L U Q_R^T.

Sides longer than max_precond_dim keep the identity basis. Deliberate differences from EO: 3-D expert stacks are
handled (batched eigh/QR), refreshes can be amortised (EO refreshes every step), projections use matmul instead
of tensordot (equal up to rounding), fused matrices are not split. Non-finite gradients are caught before any
state changes (skip or raise); a non-finite update from finite gradients (e.g. an eigh breakdown after a huge
gradient overflowed L or R) is never applied to the weights, is reported as kind "update", and resets that
parameter's state (factors, bases, moments, step), so later steps recover. State is fp32, fp64 for fp64 parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from optim.configs import SOAPConfig
from optim.functional import soap_math as sm
from optim.optimizers.base import (
    check_param_group,
    config_from,
    finite_flags,
    handle_nonfinite,
    keep_state_dtypes,
    param_names,
    reject_sparse_grads,
)

GROUP_OPTIONS = ("lr", "betas", "shampoo_beta", "eps", "weight_decay")
"""The options a param group may set; the rest of the config holds for every group."""


class SOAP(torch.optim.Optimizer):
    """SOAP / REKLS over 2-D matrices and 3-D expert stacks.

    Args:
        params: tensors, (name, tensor) pairs, or groups (lr, betas, shampoo_beta, eps, weight_decay per group).
        config: SOAPConfig (REKLS by default).
    """

    def __init__(self, params: Any, config: SOAPConfig | float | None = None, **hyperparameters: Any) -> None:
        config = config_from(SOAPConfig, config, hyperparameters)
        defaults = {
            "lr": config.lr,
            "betas": config.betas,
            "shampoo_beta": config.shampoo_beta,
            "eps": config.eps,
            "weight_decay": config.weight_decay,
        }
        self.config = config
        self.nonfinite_events: list[tuple[str, int, str]] = []
        self.num_skipped_updates = 0
        """Parameter updates skipped for a NaN/Inf (nonfinite_policy="skip"), over this optimizer's life."""
        super().__init__(params, defaults)  # checks each group (`add_param_group`)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch.optim's, plus the constructor's checks of the group (`check_param_group`)."""
        super().add_param_group(param_group)
        try:
            index = len(self.param_groups) - 1
            check_param_group("SOAP", self.param_groups[-1], index, (2, 3), self.config, GROUP_OPTIONS)
        except ValueError:
            self.param_groups.pop()
            raise

    def _init_state(self, p: torch.Tensor) -> dict[str, Any]:
        st: dict[str, Any] = self.state[p]
        if not st:
            cap = self.config.max_precond_dim
            lead = p.shape[:-2]
            dtype = torch.float64 if p.dtype == torch.float64 else torch.float32  # fp32 at least, fp64 kept
            st["step"] = 0
            st["exp_avg"] = torch.zeros(p.shape, dtype=dtype, device=p.device)
            st["exp_avg_sq"] = torch.zeros(p.shape, dtype=dtype, device=p.device)
            for side, k in (("L", p.size(-2)), ("R", p.size(-1))):
                if k <= cap:
                    st[side] = torch.zeros(*lead, k, k, dtype=dtype, device=p.device)
                    st[f"Q_{side}"] = torch.eye(k, dtype=dtype, device=p.device).expand(*lead, k, k).clone()
        return st

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One update of every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        cfg = self.config
        names = param_names(self.param_groups)
        todo = [(p, g) for g in self.param_groups for p in g["params"] if p.grad is not None]
        reject_sparse_grads("SOAP", [p for p, _ in todo], self.param_groups)
        flags = finite_flags(p.grad for p, _ in todo)
        bad = [
            (names[id(p)], self._init_state(p)["step"] + 1, "grad")
            for (p, _), ok in zip(todo, flags)
            if not ok
        ]
        self.num_skipped_updates += handle_nonfinite(bad, cfg.nonfinite_policy, self.nonfinite_events)
        updates = []
        for (p, group), ok in zip(todo, flags, strict=True):
            st = self._init_state(p)
            st["step"] += 1
            if ok:
                try:
                    u = self._direction(p, group, st)
                except torch.linalg.LinAlgError:  # type: ignore[attr-defined]  # an overflowed factor: kind "update"
                    u = torch.full_like(p, float("nan"))
                updates.append((p, group, u))
        upd_ok = finite_flags(u for _, _, u in updates)
        late = [
            (names[id(p)], self.state[p]["step"], "update")
            for (p, _, _), ok in zip(updates, upd_ok)
            if not ok
        ]
        for (p, _, _), ok in zip(updates, upd_ok, strict=True):
            if not ok:  # the factors and moments hold the breakdown's inf / NaN: the next step starts afresh
                self.state[p].clear()
        self.num_skipped_updates += handle_nonfinite(
            late, cfg.nonfinite_policy, self.nonfinite_events, state="preconditioner reset"
        )
        for (p, group, u), ok in zip(updates, upd_ok, strict=True):
            if not ok:
                continue
            lr, wd = group["lr"], group["weight_decay"]
            if wd != 0 and cfg.weight_decay_method == "decoupled":
                p.add_(p, alpha=-lr * wd)
            elif wd != 0 and cfg.weight_decay_method == "independent":
                p.add_(p, alpha=-wd)
            p.add_(u.view_as(p), alpha=-lr)
        return loss

    def _direction(self, p: torch.Tensor, group: dict[str, Any], st: dict[str, Any]) -> torch.Tensor:
        """Steps 1-3 of the module doc up to the rotated-back Adam direction (state updated in place)."""
        cfg = self.config
        t = st["step"]  # already incremented: 1-based
        dtype = st["exp_avg"].dtype
        g = p.grad.to(dtype).reshape(-1, *p.shape[-2:])  # type: ignore[union-attr]
        if cfg.weight_decay_method == "l2" and group["weight_decay"] != 0:
            g = g + group["weight_decay"] * p.to(dtype).reshape_as(g)

        def b3(name: str) -> torch.Tensor | None:
            x = st.get(name)
            return None if x is None else x.view(-1, *x.shape[-2:])

        l, r, q_l, q_r = b3("L"), b3("R"), b3("Q_L"), b3("Q_R")
        beta = group["shampoo_beta"]
        if cfg.correct_bias:
            beta = 1 - (1 - beta) / (1 - beta**t)
        if cfg.use_kl_shampoo:
            upd_l, upd_r = sm.kl_factor_updates(g, l, r, q_l, q_r, cfg.eps_eigenvalue)
        else:
            upd_l, upd_r = sm.factor_updates(g, l is not None, r is not None)
        for f, u in ((l, upd_l), (r, upd_r)):
            if f is not None and u is not None:
                f.lerp_(u, 1 - beta)
        exp_avg, exp_avg_sq = b3("exp_avg"), b3("exp_avg_sq")
        assert exp_avg is not None and exp_avg_sq is not None
        if (t - 1) % cfg.precondition_frequency == 0:
            q_l, q_r = self._refresh(st, l, r, q_l, q_r, exp_avg, exp_avg_sq, use_eigh=cfg.use_eigh or t == 1)
        g_rot = sm.rotate(g, q_l, q_r)
        d = sm.adam_direction(
            g_rot,
            exp_avg,
            exp_avg_sq,
            betas=group["betas"],
            eps=group["eps"],
            step=t,
            correct_bias=cfg.correct_bias,
            nesterov=cfg.nesterov,
        )
        return sm.rotate_back(d, q_l, q_r)

    def _refresh(
        self,
        st: dict[str, Any],
        l: sm.Basis,
        r: sm.Basis,
        q_l: sm.Basis,
        q_r: sm.Basis,
        exp_avg: torch.Tensor,
        exp_avg_sq: torch.Tensor,
        *,
        use_eigh: bool,
    ) -> tuple[sm.Basis, sm.Basis]:
        """New bases; exp_avg re-expressed and exp_avg_sq permuted in place."""
        orig = sm.rotate_back(exp_avg, q_l, q_r)
        new: list[torch.Tensor | None] = []
        for dim, f, q, key in ((-2, l, q_l, "Q_L"), (-1, r, q_r, "Q_R")):
            if f is None or q is None:
                new.append(None)
                continue
            q_sorted, idx = sm.sort_basis(f, q)
            ix = idx.unsqueeze(-1) if dim == -2 else idx.unsqueeze(-2)
            exp_avg_sq.copy_(exp_avg_sq.gather(dim, ix.expand_as(exp_avg_sq)))
            q_new = (
                sm.eigh_descending(f)
                if use_eigh
                else sm.qr_power_step(f, q_sorted, self.config.power_iter_steps)
            )
            st[key].copy_(q_new.view_as(st[key]))
            new.append(q_new)
        exp_avg.copy_(sm.rotate(orig, new[0], new[1]))
        return new[0], new[1]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch.optim load, keeping the fp32 state of low-precision parameters in fp32."""
        super().load_state_dict(state_dict)
        keep_state_dtypes(self, state_dict)
