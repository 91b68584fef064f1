"""Base of Muon and MOP: EMA momentum, shape-grouped batched orthogonalization, scaling, weight decay.

Per parameter p with gradient g (fp32 state for bf16/fp16 parameters):

    buf <- buf + (1 - beta) (g - buf)                      (EMA momentum)
    m   <- g + beta (buf - g) if nesterov else buf
    U   <- merge_j( orth(split_j(m)) * scale(rows_j, cols_j) * extra_scale_factor )
    p   <- p - lr wd p  (decoupled)   then   p <- p - lr U

Every piece (a split part of a fused matrix, or a whole matrix, or each expert of a 3-D stack) is oriented short
side first, and all pieces of equal shape in the step are concatenated and orthogonalized in ONE batched call.

Element-wise work runs as multi-tensor `torch._foreach_*` ops per (param group, dtype, device), not per parameter:
momentum and Nesterov input (`_foreach_lerp`), weight decay and update (`_foreach_add_`); scaling is one multiply
per shape group. On CPU the foreach ops apply the same per-tensor kernels as the plain ops (bitwise equal to a
per-parameter loop); on CUDA they are fused multi-tensor kernels with the same formulas.

Fused path (`optim.optimizers.fused`): Muon with `fused_step` on CUDA steps whole fp32 2-D matrices with the fused
kernels instead; speculative NS (`optim.optimizers.speculative`) lets that path use an NS computed during the
backward. Both are checked against this step.

Non-finite values: a NaN/Inf in g or in the new buf is detected before anything is written, then that parameter is
skipped with a NonFiniteWarning (its weight and old momentum are kept) or NonFiniteError is raised. Detection is
one screen per step with one host sync: the L1 norm of every orthogonalization input m (`_foreach_norm`) must be
finite. That is exact as a screen: a NaN/Inf in g makes buf non-finite, a non-finite buf makes m non-finite, and
a non-finite m makes its norm non-finite. Only when the screen fails (a real NaN/Inf, or an L1 norm overflowing
fp32) are g and buf checked per parameter (a second sync), so events and skips are those of a per-parameter check.

Tensor parallelism (`optim.optimizers.sharded`): a parameter with a `TPSpec` is one shard of a larger matrix,
orthogonalized by `tp_newton_schulz`; parameters without a spec take the path above unchanged.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from optim.distributed.tp_orthogonalize import TPMode
from optim.functional.split import RowSplit
from optim.optimizers.base import Entry as _Entry
from optim.optimizers.base import bucket as _bucket
from optim.optimizers.base import (
    check_param_group,
    handle_nonfinite,
    host_flags,
    keep_state_dtypes,
    param_names,
    reject_sparse_grads,
    state_dtype,
)
from optim.optimizers.fused import FusedStepMixin, _FusedBucket
from optim.optimizers.sharded import TPShardedMixin, _all_ranks_true, _all_reduce_min
from optim.optimizers.speculative import SpeculativeNSMixin, _Speculation
from optim.optimizers.tp import TPModeFn, TPSpec


GROUP_OPTIONS = ("lr", "momentum", "weight_decay")
"""The options a param group may set; the rest of the config holds for every group."""


def _dtype_device_of_buf(slot: tuple[int, torch.Tensor, torch.Tensor]) -> tuple[torch.dtype, torch.device]:
    return slot[2].dtype, slot[2].device


def shape_scale(rows: int, cols: int, mode: str) -> float:
    """Update scale of an orthogonalized (rows = out, cols = in) matrix (EO `get_muon_scale_factor`)."""
    if mode == "spectral":
        return math.sqrt(max(rows, cols))
    if mode == "shape_scaling":
        return math.sqrt(max(1.0, rows / cols))
    if mode == "unit_rms_norm":
        return math.sqrt(rows / cols)
    raise ValueError(f"scale_mode={mode!r} is not one of ('spectral', 'shape_scaling', 'unit_rms_norm')")


class OrthogonalizedOptimizer(SpeculativeNSMixin, FusedStepMixin, TPShardedMixin):
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
        defaults = {"lr": config.lr, "momentum": config.momentum, "weight_decay": config.weight_decay}
        self.config = config
        self.splits: dict[int, RowSplit] = {id(p): s for p, s in (splits or {}).items()}
        self.num_skipped_updates = 0
        """Parameter updates skipped for a NaN/Inf (nonfinite_policy="skip"), over this optimizer's life."""
        super().__init__(params, defaults)  # checks each group (`add_param_group`)
        self.tp: dict[int, TPSpec] = {id(p): s for p, s in (tp or {}).items()}
        """id(parameter) -> its TP spec (parameters without one are whole matrices)."""
        self.tp_mode_fn = tp_mode_fn
        self.tp_modes: dict[str, str] = {}
        """Parameter name -> the TP mode it runs (fixed modes at construction, "auto" ones after the first step)."""
        self._tp_mode: dict[int, TPMode] = {}
        self._check_tp()
        self.nonfinite_events: list[tuple[str, int, str]] = []
        """Every (parameter name, step, "grad" | "momentum") whose update was skipped or raised."""
        self._grads_known_finite = False
        self._packed_sumsq: torch.Tensor | None = None
        """Squared Frobenius norms of the stack the fused step passes to the `_orthogonalize` call it is making
        (`fused_step.momentum_pack_with_norms`), None at any other time; the orthogonalize may use them to skip
        its norm pass."""
        # Host-side structures of the fused path, rebuilt only when the parameter set or the state changes:
        # (ids of the statically eligible parameters, that list) and (ids of the stepped parameters, buckets).
        # With ~1,500 expert matrices the per-parameter Python of building them took ~7 ms per step on the H200,
        # during which the GPU idled (it follows Megatron's grad-norm sync).
        self._fused_static: tuple[tuple[int, ...], list[torch.Tensor], dict[int, dict[str, Any]]] | None = (
            None
        )
        self._fused_buckets: tuple[tuple[int, ...], list[_FusedBucket]] | None = (
            None  # key: ids, state id / size
        )
        # (shape, pieces) the fused path has orthogonalized (their NS plans are measured), and its side streams.
        self._fused_seen: set[tuple[tuple[int, ...], int]] = set()
        self._fused_streams: dict[torch.device, torch.cuda.Stream] = {}
        # Speculative NS (`speculate`): results waiting for the step, whether the caller confirmed them, the
        # orthogonalize function speculation calls (instrumented apart from the step's), and per-step counts.
        self._spec: list[_Speculation] = []
        self._spec_confirmed = False
        self._spec_orthogonalize: (
            Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]] | None
        ) = None
        self.spec_stats: dict[str, int] = {"used": 0, "discarded": 0}
        """Matrices whose speculative NS the last step used / threw away (reset at each step)."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch.optim's, plus the constructor's checks of the group (`check_param_group`) and of its splits."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            check_param_group(
                type(self).__name__, group, len(self.param_groups) - 1, (2, 3), self.config, GROUP_OPTIONS
            )
            for p in group["params"]:
                split = self.splits.get(id(p))
                if split is not None and split.rows != p.size(-2):
                    raise ValueError(f"{split} does not fit a parameter of shape {tuple(p.shape)}")
        except ValueError:
            self.param_groups.pop()
            raise

    def _orthogonalize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, m, n), m <= n -> (orthogonalized stack, optional per-matrix scale of shape (B,))."""
        raise NotImplementedError

    def instrument(self, wrap: Callable[[Callable[..., Any], str], Callable[..., Any]]) -> None:
        """Route every orthogonalization call through `wrap(fn, "ns")` (a timer, a profiler range): the batched
        whole-matrix and fused-bucket calls (`fn(x)`, x the (B, r, c) stack) and the TP-shard calls (`fn(x, *,
        mode, spec, shard_sizes)`); the speculative ones (`speculate`) through `wrap(fn, "ns_overlap")`. Once."""
        raw = self._orthogonalize
        self._orthogonalize = wrap(raw, "ns")  # type: ignore[method-assign]
        self._spec_orthogonalize = wrap(raw, "ns_overlap")
        if self.tp:
            self._orthogonalize_tp = wrap(self._orthogonalize_tp, "ns")  # type: ignore[method-assign]

    def assume_finite_grads(self) -> None:
        """The caller has established that every gradient of the coming step is finite (Megatron's wrapper: a finite
        global gradient norm, which bounds every element); the next `step()` skips the fused path's gradient screen
        and its host sync. One-shot: consumed by that step. The momentum-overflow check stays."""
        self._grads_known_finite = True

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
        known_finite, self._grads_known_finite = self._grads_known_finite, False
        spec = self._take_speculation()
        fused = self._fused_params()
        if fused:
            self._fused_step(fused, grads_known_finite=known_finite, spec=spec)
        else:
            self.spec_stats["discarded"] += sum(len(sp.params) for sp in spec)
        # Transient memory: the new momentum (and the Nesterov input) of every parameter until the update.
        entries = self._momentum(skip={id(p) for p in fused})
        if not entries:
            return loss
        good, events = self._check_finite(entries)
        self.num_skipped_updates += handle_nonfinite(events, cfg.nonfinite_policy, self.nonfinite_events)
        for e in entries:
            self.state[e.p]["step"] += 1
        for e in good:
            self.state[e.p]["momentum_buffer"] = e.new_buf
        updates = self._orthogonalize_all([(e.p, e.m) for e in good])
        pairs = list(zip(good, updates, strict=True))
        for bucket in _bucket(pairs, lambda eu: (id(eu[0].group), eu[0].p.dtype, eu[0].p.device)):
            group = bucket[0][0].group
            lr, wd = group["lr"], group["weight_decay"]
            ps = [e.p for e, _ in bucket]
            if wd != 0 and cfg.weight_decay_method == "decoupled":
                torch._foreach_add_(ps, ps, alpha=-lr * wd)
            elif wd != 0 and cfg.weight_decay_method == "independent":
                torch._foreach_add_(ps, ps, alpha=-wd)
            torch._foreach_add_(ps, [u for _, u in bucket], alpha=-lr)
        return loss

    def _momentum(self, skip: set[int] | None = None) -> list[_Entry]:
        """New momentum and orthogonalization input of every parameter with a gradient (state not yet written),
        except the parameters in `skip` (ids; stepped by the fused path)."""
        cfg = self.config
        skip = skip or set()
        entries: list[_Entry] = []
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
            out: dict[int, _Entry] = {}
            for bucket in _bucket(slots, _dtype_device_of_buf):
                dtype = bucket[0][2].dtype
                grads = [p.grad.to(dtype) for _, p, _ in bucket]
                if cfg.weight_decay_method == "l2" and wd != 0:
                    grads = list(torch._foreach_add(grads, [p.to(dtype) for _, p, _ in bucket], alpha=wd))
                new_bufs = torch._foreach_lerp([b for _, _, b in bucket], grads, 1 - beta)
                ms = torch._foreach_lerp(grads, new_bufs, beta) if cfg.nesterov else new_bufs
                for (i, p, _), nb, m in zip(bucket, new_bufs, ms, strict=True):
                    out[i] = _Entry(p, group, nb, m)
            entries += [out[i] for i in range(len(ps))]
        return entries

    def _check_finite(self, entries: list[_Entry]) -> tuple[list[_Entry], list[tuple[str, int, str]]]:
        """(entries to update, (name, step, kind) of the skipped ones); see the module docstring.

        TP-sharded entries are decided per TP group: a shard is skipped on every rank of its group when any rank
        saw a non-finite value in its own shard (kind "tp_peer" on the ranks whose shard was finite), so that the
        group's NS collectives stay matched. Costs one 1-element all-reduce per TP group and step (a second one,
        per parameter, only when some rank of the group failed its screen)."""
        screens = [
            torch.isfinite(torch.stack(torch._foreach_norm([e.m for e in bucket], 1))).all()
            for bucket in _bucket(entries, lambda e: (e.m.dtype, e.m.device))
        ]
        local_ok = all(host_flags(screens))
        groups = self._tp_groups(entries)
        bad_groups = [g for g in groups if not _all_ranks_true(local_ok, g, entries[0].m.device)]
        if local_ok and not bad_groups:
            return entries, []
        cfg = self.config
        flags = [True] * (2 * len(entries))
        if not local_ok:
            checks = []
            for e in entries:
                g = e.p.grad.to(e.new_buf.dtype)  # type: ignore[union-attr]
                wd = e.group["weight_decay"]
                if cfg.weight_decay_method == "l2" and wd != 0:
                    g = g.add(e.p.to(e.new_buf.dtype), alpha=wd)
                checks += [torch.isfinite(g).all(), torch.isfinite(e.new_buf).all()]
            flags = host_flags(checks)
        peer_bad: set[int] = set()
        for grp in bad_groups:
            idx = [i for i, e in enumerate(entries) if id(e.p) in self.tp and self.tp[id(e.p)].group is grp]
            mine = torch.tensor(
                [float(flags[2 * i] and flags[2 * i + 1]) for i in idx], device=entries[0].m.device
            )
            _all_reduce_min(mine, grp)
            peer_bad |= {i for i, ok in zip(idx, mine.tolist(), strict=True) if not ok}
        names = param_names(self.param_groups)
        good, events = [], []
        for i, e in enumerate(entries):
            if flags[2 * i] and flags[2 * i + 1] and i not in peer_bad:
                good.append(e)
            else:
                kind = "grad" if not flags[2 * i] else "momentum" if not flags[2 * i + 1] else "tp_peer"
                events.append((names[id(e.p)], self.state[e.p]["step"] + 1, kind))
        return good, events

    def _orthogonalize_all(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """Whole matrices by `_orthogonalize_plain`, TP shards by `_orthogonalize_sharded`, in input order."""
        if not self.tp:
            return self._orthogonalize_plain(items)
        sharded = [id(p) in self.tp for p, _ in items]
        outs = iter(self._orthogonalize_plain([it for it, s in zip(items, sharded, strict=True) if not s]))
        tp_outs = iter(self._orthogonalize_sharded([it for it, s in zip(items, sharded, strict=True) if s]))
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
        """Pieces of one oriented shape -> scaled orthogonalized pieces, each of its piece's shape.

        One `_orthogonalize` call on the stack of all pieces (tall ones transposed), then one scale multiply over
        the stack. Outputs come back in the pieces' own orientation and contiguous, so that the update runs on
        the fast multi-tensor path.
        """
        # 2-D pieces are stacked and unbound in one call each (no per-piece views); a lone piece is passed as a
        # view, as before, so that the NS input layout (and result) of such a group does not change.
        flat = len(parts) > 1 and all(part.ndim == 2 for part in parts)
        views = parts if flat else [part.reshape(-1, *part.shape[-2:]) for part in parts]
        tall = [v.size(-2) > v.size(-1) for v in views]
        oriented = [v.mT if t else v for v, t in zip(views, tall, strict=True)]
        if flat:
            x = torch.stack(oriented)
        else:
            x = oriented[0] if len(oriented) == 1 else torch.cat(oriented)
        orth, mscale = self._orthogonalize(x)
        counts = [1] * len(parts) if flat else [v.size(0) for v in views]
        scale_of: dict[tuple[int, int], float] = {}
        scales = []
        for part in parts:
            rc = (part.size(-2), part.size(-1))
            if rc not in scale_of:
                scale_of[rc] = self._shape_scale(*rc)
            scales.append(scale_of[rc])
        all_tall = all(tall)
        src = orth.mT if all_tall else orth
        scaled = torch.empty(src.shape, dtype=orth.dtype, device=orth.device)
        # One multiply per run of equal scale (one run unless tall and wide pieces differ in scale): Python
        # float factors, no per-matrix factor tensor (its host-to-device copy would sync on CUDA).
        offsets = [0, *itertools.accumulate(counts)]
        start = 0
        for k in range(1, len(parts) + 1):
            if k == len(parts) or scales[k] != scales[start]:
                lo, hi = offsets[start], offsets[k]
                torch.mul(src[lo:hi], scales[start], out=scaled[lo:hi])
                start = k
        if mscale is not None:
            scaled.mul_(mscale.view(-1, 1, 1))
        outs = list(scaled.unbind(0) if flat else torch.split(scaled, counts))
        if not all_tall:
            outs = [o.mT.contiguous() if t else o for o, t in zip(outs, tall, strict=True)]
        if flat:
            return outs
        return [o.reshape(part.shape) for o, part in zip(outs, parts, strict=True)]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch.optim load, keeping fp32 momentum of low-precision parameters in fp32."""
        super().load_state_dict(state_dict)
        keep_state_dtypes(self, state_dict)
        self._fused_buckets = None  # the momentum buffers are new tensors
