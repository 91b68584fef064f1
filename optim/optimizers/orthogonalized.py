"""Base of Muon and MOP: the reference step. EMA momentum, shape-grouped batched orthogonalization, scaling, decay.

Per parameter p with gradient g (fp32 state for bf16/fp16 parameters):

    buf <- buf + (1 - beta) (g - buf)                      (EMA momentum)
    m   <- g + beta (buf - g) if nesterov else buf
    U   <- merge_j( orth(split_j(m)) * scale(rows_j, cols_j) * extra_scale_factor )
    p   <- p - lr wd p  (decoupled)   then   p <- p - lr U

Every piece (a split part of a fused matrix, a whole matrix, or each expert of a 3-D stack) is oriented short side
first, and all pieces of equal shape in the step are orthogonalized in ONE batched call (`_orthogonalize`, the
subclass's algorithm). Element-wise work runs as `torch._foreach_*` ops per (param group, dtype, device): on CPU
bitwise equal to a per-parameter loop, on CUDA fused multi-tensor kernels with the same formulas.

Non-finite values: a NaN/Inf in g or in the new buf is detected before anything is written, then that parameter is
skipped with a NonFiniteWarning (weight and old momentum kept; counted in `num_skipped_updates`) or NonFiniteError
is raised. The screen is one host sync per step: the L1 norm of every orthogonalization input m must be finite (a
NaN/Inf in g makes buf, m and the norm non-finite). Only when it fails (a real NaN/Inf, or an L1 norm overflowing
fp32) are g and buf checked per parameter, so events and skips are those of a per-parameter check.

Two parts sit beside this step as objects with their own state, chosen at construction: `self.sharding`
(`optim.optimizers.sharded.TPSharding`: TP shards, orthogonalized by `_orthogonalize_tp`, scaled by the full shape,
skips agreed over each TP group) and `self.fused` (`optim.optimizers.fused.FusedStep`, Muon on CUDA: whole fp32
matrices stepped by fused kernels first, with speculative NS; checked against this step in test_muon_fused.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from optim.functional.split import RowSplit
from optim.optimizers.base import (
    Entry,
    bucket,
    check_param_group,
    handle_nonfinite,
    host_flags,
    keep_state_dtypes,
    param_names,
    reject_sparse_grads,
    state_dtype,
)
from optim.optimizers.protocols import FusedStepView
from optim.optimizers.sharded import TPSharding
from optim.optimizers.tp import TPModeFn, TPSpec

if TYPE_CHECKING:
    from optim.configs import TPMode

GROUP_OPTIONS = ("lr", "momentum", "weight_decay")
"""The options a param group may set; the rest of the config holds for every group."""


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
        self,
        params: Any,
        config: Any,
        *,
        splits: Mapping[torch.Tensor, RowSplit] | None = None,
        tp: Mapping[torch.Tensor, TPSpec] | None = None,
        tp_mode_fn: TPModeFn | None = None,
    ) -> None:
        self.config = config
        self.splits: dict[int, RowSplit] = {id(p): s for p, s in (splits or {}).items()}
        self.nonfinite_events: list[tuple[str, int, str]] = []
        """Every (parameter name, step, "grad" | "momentum" | "tp_peer") whose update was skipped or raised."""
        # A dict item, not an int attribute: torch.compile traces an item update, not a setattr on the optimizer
        self._counts = {"skipped_updates": 0}
        defaults = {"lr": config.lr, "momentum": config.momentum, "weight_decay": config.weight_decay}
        super().__init__(params, defaults)  # checks each group (`add_param_group`)
        self.sharding = TPSharding(self.param_groups, dict(tp), self.splits, tp_mode_fn) if tp else None
        self.fused: FusedStepView | None = None  # the fused CUDA step, where the subclass offers one (Muon)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch.optim's, plus the constructor's checks of the group (`check_param_group`) and of its splits."""
        super().add_param_group(param_group)
        group, index = self.param_groups[-1], len(self.param_groups) - 1
        try:
            check_param_group(type(self).__name__, group, index, (2, 3), self.config, GROUP_OPTIONS)
            for p in group["params"]:
                split = self.splits.get(id(p))
                if split is not None and split.rows != p.size(-2):
                    raise ValueError(f"{split} does not fit a parameter of shape {tuple(p.shape)}")
        except ValueError:
            self.param_groups.pop()
            raise

    @property
    def tp_modes(self) -> dict[str, str]:
        """Parameter name -> the TP mode it runs (fixed modes at construction, "auto" ones after the first step)."""
        return self.sharding.modes if self.sharding is not None else {}

    def rekey(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Move splits and TP specs from each old parameter tensor to its new one (Megatron's fp32 copies)."""
        self.splits = {id(new): self.splits[id(old)] for old, new in pairs if id(old) in self.splits}
        if self.sharding is not None:
            self.sharding.splits = self.splits
            self.sharding.rekey(pairs)

    def instrument(self, wrap: Callable[[Callable[..., Any], str], Callable[..., Any]]) -> None:
        """Route every orthogonalization call through `wrap(fn, "ns")` (a timer, a profiler range): the batched
        whole-matrix and fused-bucket calls (`fn(x)`, x the (B, r, c) stack) and the TP-shard calls (`fn(x, *,
        mode, spec, shard_sizes)`); the speculative ones through `wrap(fn, "ns_overlap")`. Once."""
        raw = self._orthogonalize
        self._orthogonalize = wrap(raw, "ns")  # type: ignore[method-assign]
        if self.fused is not None:
            self.fused.speculation.orthogonalize = wrap(raw, "ns_overlap")
        if self.sharding is not None:
            self._orthogonalize_tp = wrap(self._orthogonalize_tp, "ns")  # type: ignore[method-assign]

    def _orthogonalize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, m, n), m <= n -> (orthogonalized stack, optional per-matrix scale of shape (B,))."""
        raise NotImplementedError

    def _orthogonalize_tp(
        self, x: torch.Tensor, *, mode: TPMode, spec: TPSpec, shard_sizes: tuple[int, ...] | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, r, c) TP shards (sharded along spec.dim) -> (orthogonalized shards, optional per-matrix scale)."""
        raise NotImplementedError(f"{type(self).__name__} does not support tensor-parallel parameters")

    def _shape_scale(self, rows: int, cols: int) -> float:
        if self.config.scale_mode == "nuclear_norm":
            return float(self.config.extra_scale_factor)
        return shape_scale(rows, cols, self.config.scale_mode) * float(self.config.extra_scale_factor)

    @property
    def num_skipped_updates(self) -> int:
        """Parameter updates skipped for a NaN/Inf (nonfinite_policy="skip"), over this optimizer's life."""
        return self._counts["skipped_updates"]

    def _report_nonfinite(self, events: list[tuple[str, int, str]]) -> None:
        skipped = handle_nonfinite(events, self.config.nonfinite_policy, self.nonfinite_events)
        self._counts["skipped_updates"] += skipped

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One update of every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        cfg = self.config
        fused = self.fused.params() if self.fused is not None else []
        if self.fused is not None:  # the parameters it takes, before this step
            self.fused.step(fused)
        # Transient memory: the new momentum (and the Nesterov input) of every parameter until the update.
        entries = self._momentum(skip={id(p) for p in fused})
        if not entries:
            return loss
        good, events = self._check_finite(entries)
        self._report_nonfinite(events)
        for e in entries:
            self.state[e.p]["step"] += 1
        for e in good:
            self.state[e.p]["momentum_buffer"] = e.new_buf
        updates = self._orthogonalize_all([(e.p, e.m) for e in good])
        pairs = list(zip(good, updates, strict=True))
        for same in bucket(pairs, lambda eu: (id(eu[0].group), eu[0].p.dtype, eu[0].p.device)):
            group = same[0][0].group
            lr, wd = group["lr"], group["weight_decay"]
            ps = [e.p for e, _ in same]
            if wd != 0 and cfg.weight_decay_method == "decoupled":
                torch._foreach_add_(ps, ps, alpha=-lr * wd)
            elif wd != 0 and cfg.weight_decay_method == "independent":
                torch._foreach_add_(ps, ps, alpha=-wd)
            torch._foreach_add_(ps, [u for _, u in same], alpha=-lr)
        return loss

    def _momentum(self, skip: set[int]) -> list[Entry]:
        """New momentum and orthogonalization input of every parameter with a gradient (state not yet written),
        except the parameters in `skip` (ids; stepped by the fused path)."""
        cfg = self.config
        entries: list[Entry] = []
        for group in self.param_groups:
            beta, wd = group["momentum"], group["weight_decay"]
            ps = [p for p in group["params"] if p.grad is not None and id(p) not in skip]
            reject_sparse_grads(type(self).__name__, ps, self.param_groups)
            for p in ps:
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["momentum_buffer"] = torch.zeros_like(p, dtype=state_dtype(p))
            slots = [(i, p, self.state[p]["momentum_buffer"]) for i, p in enumerate(ps)]
            out: dict[int, Entry] = {}
            for same in bucket(slots, lambda slot: (slot[2].dtype, slot[2].device)):
                dtype = same[0][2].dtype
                grads = [p.grad.to(dtype) for _, p, _ in same]
                if cfg.weight_decay_method == "l2" and wd != 0:
                    grads = list(torch._foreach_add(grads, [p.to(dtype) for _, p, _ in same], alpha=wd))
                new_bufs = torch._foreach_lerp([b for _, _, b in same], grads, 1 - beta)
                ms = torch._foreach_lerp(grads, new_bufs, beta) if cfg.nesterov else new_bufs
                for (i, p, _), nb, m in zip(same, new_bufs, ms, strict=True):
                    out[i] = Entry(p, group, nb, m)
            entries += [out[i] for i in range(len(ps))]
        return entries

    def _check_finite(self, entries: list[Entry]) -> tuple[list[Entry], list[tuple[str, int, str]]]:
        """(entries to update, (name, step, kind) of the skipped ones); see the module docstring. A TP shard is
        skipped on every rank of its group when any rank's shard failed ("tp_peer" where this one's was finite)."""
        screens = [
            torch.isfinite(torch.stack(torch._foreach_norm([e.m for e in same], 1))).all()
            for same in bucket(entries, lambda e: (e.m.dtype, e.m.device))
        ]
        local_ok = all(host_flags(screens))
        params = [e.p for e in entries]
        failed = self.sharding.failed_groups(params, local_ok) if self.sharding is not None else []
        if local_ok and not failed:
            return entries, []
        flags = [True] * (2 * len(entries))
        if not local_ok:
            checks = []
            for e in entries:
                g = e.p.grad.to(e.new_buf.dtype)  # type: ignore[union-attr]
                wd = e.group["weight_decay"]
                if self.config.weight_decay_method == "l2" and wd != 0:
                    g = g.add(e.p.to(e.new_buf.dtype), alpha=wd)
                checks += [torch.isfinite(g).all(), torch.isfinite(e.new_buf).all()]
            flags = host_flags(checks)
        ok = [flags[2 * i] and flags[2 * i + 1] for i in range(len(entries))]
        if failed:
            assert self.sharding is not None
            ok = self.sharding.agree(params, ok, failed)
        names = param_names(self.param_groups)
        good, events = [], []
        for i, e in enumerate(entries):
            if ok[i]:
                good.append(e)
            else:
                kind = "grad" if not flags[2 * i] else "momentum" if not flags[2 * i + 1] else "tp_peer"
                events.append((names[id(e.p)], self.state[e.p]["step"] + 1, kind))
        return good, events

    def _orthogonalize_all(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """Whole matrices by `_orthogonalize_plain`, TP shards by the sharding, in input order."""
        if self.sharding is None:
            return self._orthogonalize_plain(items)
        sharded = [self.sharding.owns(p) for p, _ in items]
        outs = iter(self._orthogonalize_plain([it for it, s in zip(items, sharded, strict=True) if not s]))
        tp_items = [it for it, s in zip(items, sharded, strict=True) if s]
        tp_outs = iter(self.sharding.orthogonalize(tp_items, self._orthogonalize_tp, self._shape_scale))
        return [next(tp_outs) if s else next(outs) for s in sharded]

    def _orthogonalize_plain(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """Split, group pieces by oriented shape, one batched call per shape, scale, merge."""
        pieces: list[list[torch.Tensor]] = []
        buckets: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for i, (p, m) in enumerate(items):
            split = self.splits.get(id(p))
            parts = split.split(m) if split is not None else [m]
            pieces.append(parts)
            for j, part in enumerate(parts):
                rows, cols = part.shape[-2:]
                buckets.setdefault((rows, cols) if rows <= cols else (cols, rows), []).append((i, j))
        for idxs in buckets.values():
            outs = self._orthogonalize_bucket([pieces[i][j] for i, j in idxs])
            for (i, j), o in zip(idxs, outs, strict=True):
                pieces[i][j] = o  # the input piece is no longer needed
        result = []
        for (p, _), parts_out in zip(items, pieces, strict=True):
            split = self.splits.get(id(p))
            result.append(split.merge(parts_out) if split is not None else parts_out[0])
        return result

    def _orthogonalize_bucket(self, parts: list[torch.Tensor]) -> list[torch.Tensor]:
        """Pieces of one oriented shape -> scaled orthogonalized pieces, each of its piece's shape: one
        `_orthogonalize` call on the stack of all pieces (tall ones transposed), one scale multiply per run of equal
        scale; outputs in the pieces' own orientation and contiguous (the fast multi-tensor path)."""
        # 2-D pieces are stacked and unbound in one call each; a lone piece is passed as a view, so that the NS
        # input layout (and result) of such a group is that of the whole matrix.
        flat = len(parts) > 1 and all(part.ndim == 2 for part in parts)
        views = parts if flat else [part.reshape(-1, *part.shape[-2:]) for part in parts]
        tall = [v.size(-2) > v.size(-1) for v in views]
        oriented = [v.mT if t else v for v, t in zip(views, tall, strict=True)]
        x = torch.stack(oriented) if flat else oriented[0] if len(oriented) == 1 else torch.cat(oriented)
        orth, mscale = self._orthogonalize(x)
        counts = [1] * len(parts) if flat else [v.size(0) for v in views]
        scale_of: dict[tuple[int, int], float] = {}
        for part in parts:
            rc = (part.size(-2), part.size(-1))
            scale_of.setdefault(rc, self._shape_scale(*rc))
        scales = [scale_of[(part.size(-2), part.size(-1))] for part in parts]
        all_tall = all(tall)
        src = orth.mT if all_tall else orth
        scaled = torch.empty(src.shape, dtype=orth.dtype, device=orth.device)
        # Python float factors, no per-matrix factor tensor (its host-to-device copy would sync on CUDA).
        offsets = [0, *itertools.accumulate(counts)]
        start = 0
        for k in range(1, len(parts) + 1):
            if k == len(parts) or scales[k] != scales[start]:
                torch.mul(src[offsets[start] : offsets[k]], scales[start], out=scaled[offsets[start] : offsets[k]])
                start = k
        if mscale is not None:
            scaled.mul_(mscale.view(-1, 1, 1))
        outs = list(scaled.unbind(0) if flat else torch.split(scaled, counts))
        if not all_tall:
            outs = [o.mT.contiguous() if t else o for o, t in zip(outs, tall, strict=True)]
        return outs if flat else [o.reshape(part.shape) for o, part in zip(outs, parts, strict=True)]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch.optim load, keeping fp32 momentum of low-precision parameters in fp32."""
        super().load_state_dict(state_dict)
        keep_state_dtypes(self, state_dict)
        if self.fused is not None:
            self.fused.forget_buckets()  # the momentum buffers are new tensors
