"""Base of Muon and MOP: EMA momentum, shape-grouped batched orthogonalization, scaling, weight decay.

Per parameter p with gradient g (fp32 state for bf16/fp16 parameters):

    buf <- buf + (1 - beta) (g - buf)                      (EMA momentum)
    m   <- g + beta (buf - g) if nesterov else buf
    U   <- merge_j( orth(split_j(m)) * scale(rows_j, cols_j) * extra_scale_factor )
    p   <- p - lr wd p  (decoupled)   then   p <- p - lr U

Every piece (a split part of a fused matrix, or a whole matrix, or each expert of a 3-D stack) is oriented short
side first, and all pieces of equal shape in the step are concatenated and orthogonalized in ONE batched call.
A NaN/Inf in g or in the new buf is detected before anything is written (one host sync per step); the parameter
is then skipped with a NonFiniteWarning (its momentum is kept) or NonFiniteError is raised.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from optim.functional.split import RowSplit
from optim.optimizers.base import handle_nonfinite, host_flags, keep_state_dtypes, param_names, state_dtype


def shape_scale(rows: int, cols: int, mode: str) -> float:
    """Update scale of an orthogonalized (rows = out, cols = in) matrix (EO `get_muon_scale_factor`)."""
    if mode == "spectral":
        return math.sqrt(max(rows, cols))
    if mode == "shape_scaling":
        return math.sqrt(max(1.0, rows / cols))
    if mode == "unit_rms_norm":
        return math.sqrt(rows / cols)
    raise ValueError(f"scale_mode={mode!r} is not one of ('spectral', 'shape_scaling', 'unit_rms_norm')")


class OrthogonalizedOptimizer(torch.optim.Optimizer):
    """Momentum + orthogonalization; subclasses define `_orthogonalize` on a (B, m, n) stack with m <= n."""

    config: Any

    def __init__(
        self, params: Any, config: Any, *, splits: Mapping[torch.Tensor, RowSplit] | None = None
    ) -> None:
        defaults = {"lr": config.lr, "momentum": config.momentum, "weight_decay": config.weight_decay}
        super().__init__(params, defaults)
        self.config = config
        self.splits: dict[int, RowSplit] = {id(p): s for p, s in (splits or {}).items()}
        self.nonfinite_events: list[tuple[str, int, str]] = []
        """Every (parameter name, step, "grad" | "momentum") whose update was skipped or raised."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim not in (2, 3):
                    raise ValueError(
                        f"{type(self).__name__} takes 2-D matrices or 3-D (experts, out, in) stacks, got shape "
                        f"{tuple(p.shape)}; route it to AdamW"
                    )
                split = self.splits.get(id(p))
                if split is not None and split.rows != p.size(-2):
                    raise ValueError(f"{split} does not fit a parameter of shape {tuple(p.shape)}")

    def _orthogonalize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, m, n), m <= n -> (orthogonalized stack, optional per-matrix scale of shape (B,))."""
        raise NotImplementedError

    def _shape_scale(self, rows: int, cols: int) -> float:
        if self.config.scale_mode == "nuclear_norm":
            return float(self.config.extra_scale_factor)
        return shape_scale(rows, cols, self.config.scale_mode) * float(self.config.extra_scale_factor)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One update of every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        cfg = self.config
        # Transient memory: the new momentum (and the Nesterov input) of every parameter until the update; the
        # fp32 copy of a low-precision gradient lives only inside the loop body.
        entries: list[tuple[torch.Tensor, dict[str, Any], torch.Tensor, torch.Tensor]] = []
        checks: list[torch.Tensor] = []
        for group in self.param_groups:
            beta, wd = group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["momentum_buffer"] = torch.zeros_like(p, dtype=state_dtype(p))
                buf = st["momentum_buffer"]
                g = p.grad.to(buf.dtype)
                if cfg.weight_decay_method == "l2" and wd != 0:
                    g = g.add(p.to(buf.dtype), alpha=wd)
                new_buf = torch.lerp(buf, g, 1 - beta)
                m = g.lerp(new_buf, beta) if cfg.nesterov else new_buf
                entries.append((p, group, new_buf, m))
                checks += [torch.isfinite(g).all(), torch.isfinite(new_buf).all()]
        flags = host_flags(checks)
        names = param_names(self.param_groups)
        good, events = [], []
        for i, e in enumerate(entries):
            st = self.state[e[0]]
            if flags[2 * i] and flags[2 * i + 1]:
                good.append(e)
            else:
                events.append((names[id(e[0])], st["step"] + 1, "grad" if not flags[2 * i] else "momentum"))
        handle_nonfinite(events, cfg.nonfinite_policy, self.nonfinite_events)
        for e in entries:
            self.state[e[0]]["step"] += 1
        for p, _, new_buf, _ in good:
            self.state[p]["momentum_buffer"] = new_buf
        updates = self._orthogonalize_all([(e[0], e[3]) for e in good])
        for (p, group, _, _), u in zip(good, updates, strict=True):
            lr, wd = group["lr"], group["weight_decay"]
            if wd != 0 and cfg.weight_decay_method == "decoupled":
                p.add_(p, alpha=-lr * wd)
            elif wd != 0 and cfg.weight_decay_method == "independent":
                p.add_(p, alpha=-wd)
            p.add_(u, alpha=-lr)
        return loss

    def _orthogonalize_all(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """Split, group pieces by oriented shape, one batched call per shape, scale, merge."""
        pieces: list[list[torch.Tensor]] = []
        buckets: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for i, (p, m) in enumerate(items):
            split = self.splits.get(id(p))
            parts = split.split(m) if split is not None else [m]
            pieces.append(parts)
            for j, part in enumerate(parts):
                rows, cols = part.shape[-2:]
                buckets.setdefault((min(rows, cols), max(rows, cols)), []).append((i, j))
        out: list[list[torch.Tensor | None]] = [[None] * len(parts) for parts in pieces]
        for idxs in buckets.values():
            stack = []
            for i, j in idxs:
                part = pieces[i][j].reshape(-1, *pieces[i][j].shape[-2:])
                stack.append(part.mT if part.size(-2) > part.size(-1) else part)
            x = stack[0] if len(stack) == 1 else torch.cat(stack)
            orth, mscale = self._orthogonalize(x)
            counts = [s.size(0) for s in stack]
            for (i, j), o, ms in zip(
                idxs, torch.split(orth, counts), _split_or_none(mscale, counts), strict=True
            ):
                shape = pieces[i][j].shape
                rows, cols = shape[-2:]
                o = o.mT if rows > cols else o
                o = o * self._shape_scale(rows, cols)
                if ms is not None:
                    o = o * ms.view(-1, 1, 1)
                out[i][j] = o.reshape(shape)
        result = []
        for (p, _), parts_out in zip(items, out, strict=True):
            done = [t for t in parts_out if t is not None]
            split = self.splits.get(id(p))
            result.append(split.merge(done) if split is not None else done[0])
        return result

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch.optim load, keeping fp32 momentum of low-precision parameters in fp32."""
        super().load_state_dict(state_dict)
        keep_state_dtypes(self, state_dict)


def _split_or_none(t: torch.Tensor | None, counts: list[int]) -> list[torch.Tensor | None]:
    return [None] * len(counts) if t is None else list(torch.split(t, counts))
