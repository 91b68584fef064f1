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

Fused path (Muon with `fused_step` on CUDA, bf16 NS; `_fused_step`): whole fp32 2-D matrices (not TP-sharded; split
only into equal contiguous row blocks of a wide matrix, e.g. gate / up, whose pieces are a view of the packed stack)
are stepped by `optim.kernels.fused_step` instead, one (group, shape, split) bucket at a time: momentum update in
place plus the bf16 NS input in one pass, one batched orthogonalize, decay and scaled update in one pass. It
differs from the path above by rounding: the NS input is rounded to bf16 before the Frobenius normalization, and
decay and update are one multiply-add. Its non-finite check screens the gradients first (see `_fused_step`).

Non-finite values: a NaN/Inf in g or in the new buf is detected before anything is written, then that parameter is
skipped with a NonFiniteWarning (its weight and old momentum are kept) or NonFiniteError is raised. Detection is
one screen per step with one host sync: the L1 norm of every orthogonalization input m (`_foreach_norm`) must be
finite. That is exact as a screen: a NaN/Inf in g makes buf non-finite, a non-finite buf makes m non-finite, and
a non-finite m makes its norm non-finite. Only when the screen fails (a real NaN/Inf, or an L1 norm overflowing
fp32) are g and buf checked per parameter (a second sync), so events and skips are those of a per-parameter check.

Tensor parallelism: a parameter with a `TPSpec` (optim.optimizers.tp) is one shard of a larger matrix. Its pieces
are orthogonalized by `tp_newton_schulz` in the spec's mode (one batched call per equal local shape, dim, group,
shard sizes and mode), scaled by the FULL piece shape (blockwise: the shard's own shape, so that it equals
per-shard Muon, as MCore's blockwise). A fused split (QKV, gate/up) of a row-sharded parameter is taken as per-rank
blocks of equal size (Megatron's layout). Parameters without a spec take the path above unchanged. Every rank of a
TP group must step the same sharded parameters in the same order, so non-finite skips of sharded parameters are
agreed over each TP group (a 1-element all-reduce per group and step; a shard is skipped on every rank when one
rank's shard is non-finite, event kind "tp_peer" on the others). The CUDA kernels (`optim.kernels`) are not used
for TP shards.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from optim.distributed.tp_orthogonalize import TPMode, tp_newton_schulz
from optim.functional.split import RowSplit
from optim.optimizers.base import (
    check_param_shapes,
    handle_nonfinite,
    host_flags,
    keep_state_dtypes,
    param_names,
    state_dtype,
)
from optim.optimizers.tp import TPModeFn, TPSpec, resolve_mode


def shape_scale(rows: int, cols: int, mode: str) -> float:
    """Update scale of an orthogonalized (rows = out, cols = in) matrix (EO `get_muon_scale_factor`)."""
    if mode == "spectral":
        return math.sqrt(max(rows, cols))
    if mode == "shape_scaling":
        return math.sqrt(max(1.0, rows / cols))
    if mode == "unit_rms_norm":
        return math.sqrt(rows / cols)
    raise ValueError(f"scale_mode={mode!r} is not one of ('spectral', 'shape_scaling', 'unit_rms_norm')")


class _Entry(NamedTuple):
    """One parameter's step: its group, the new momentum and the orthogonalization input."""

    p: torch.Tensor
    group: dict[str, Any]
    new_buf: torch.Tensor
    m: torch.Tensor


def _bucket[T](items: Iterable[T], key: Callable[[T], Hashable]) -> list[list[T]]:
    """Items grouped by key, groups in first-seen order, items in input order."""
    out: dict[Hashable, list[T]] = {}
    for it in items:
        out.setdefault(key(it), []).append(it)
    return list(out.values())


def _dtype_device_of_buf(slot: tuple[int, torch.Tensor, torch.Tensor]) -> tuple[torch.dtype, torch.device]:
    return slot[2].dtype, slot[2].device


def _all_reduce_min(t: torch.Tensor, group: Any) -> None:
    import torch.distributed as dist

    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)


def _all_ranks_true(flag: bool, group: Any, device: torch.device) -> bool:
    """True when `flag` is True on every rank of `group` (a 1-element MIN all-reduce)."""
    t = torch.tensor([float(flag)], device=device)
    _all_reduce_min(t, group)
    return bool(t.item() == 1.0)


@dataclass(slots=True)
class _FusedBucket:
    """Parameters of one (group, shape, split pieces, device) stepped together by the fused path, and their momentum
    buffers."""

    group: dict[str, Any]
    params: list[torch.Tensor]
    bufs: list[torch.Tensor]


@dataclass(slots=True)
class _Speculation:
    """The orthogonalized NS input of a same-(group, shape) set of parameters, computed before the step from final
    gradients and the momentum as it was (`OrthogonalizedOptimizer.speculate`)."""

    group: dict[str, Any]
    params: list[torch.Tensor]
    bufs: list[torch.Tensor]
    """Their momentum buffers at speculation time (the step uses the result only if they are still the state's)."""
    grads: list[torch.Tensor]
    """The gradient tensors the input was computed from: the step uses the result only if each parameter's `.grad`
    is still that tensor (same storage) and the caller confirmed the values unchanged (`confirm_speculation`)."""
    orth: torch.Tensor
    mscale: torch.Tensor | None
    amax: torch.Tensor
    """Max-abs of the NS input (0-d, on the device): the step's momentum-overflow check."""
    done: Any = None
    """CUDA event recorded after the work on the speculation stream (None on CPU or the current stream)."""


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
        defaults = {"lr": config.lr, "momentum": config.momentum, "weight_decay": config.weight_decay}
        super().__init__(params, defaults)
        self.config = config
        self.splits: dict[int, RowSplit] = {id(p): s for p, s in (splits or {}).items()}
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
        # Speculative NS (`speculate`): results waiting for the step, whether the caller confirmed them, the
        # orthogonalize function speculation calls (instrumented apart from the step's), and per-step counts.
        self._spec: list[_Speculation] = []
        self._spec_confirmed = False
        self._spec_orthogonalize: (
            Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]] | None
        ) = None
        self.spec_stats: dict[str, int] = {"used": 0, "discarded": 0}
        """Matrices whose speculative NS the last step used / threw away (reset at each step)."""
        check_param_shapes(type(self).__name__, self.param_groups, (2, 3))
        for group in self.param_groups:
            for p in group["params"]:
                split = self.splits.get(id(p))
                if split is not None and split.rows != p.size(-2):
                    raise ValueError(f"{split} does not fit a parameter of shape {tuple(p.shape)}")

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

    def _tp_ns_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `tp_newton_schulz` besides mode, dim, group and shard sizes."""
        raise NotImplementedError(f"{type(self).__name__} does not support tensor-parallel parameters")

    def _orthogonalize_tp(
        self, x: torch.Tensor, *, mode: TPMode, spec: TPSpec, shard_sizes: tuple[int, ...] | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, r, c) shards (any orientation, sharded along spec.dim) -> (orthogonalized shards, optional scale)."""
        out = tp_newton_schulz(
            x,
            mode=mode,
            partition_dim=spec.dim,
            tp_group=spec.group,
            shard_sizes=shard_sizes,
            **self._tp_ns_kwargs(),
        )
        return out, None

    def _check_tp(self) -> None:
        if not self.tp:
            return
        names = param_names(self.param_groups)
        known = {id(p): p for g in self.param_groups for p in g["params"]}
        for pid, spec in self.tp.items():
            if pid not in known:
                raise ValueError(
                    "tp: a TPSpec is keyed by a tensor that is not one of the optimizer's parameters"
                )
            p = known[pid]
            spec.check(p, names[pid])
            split = self.splits.get(pid)
            if split is not None and spec.dim == -2 and spec.shard_sizes is not None:
                raise ValueError(
                    f"{names[pid]}: a row split of a row-sharded parameter needs shard_sizes=None "
                    "(equal per-rank blocks)"
                )
            if spec.mode == "auto" and self.tp_mode_fn is None:
                raise ValueError(f"{names[pid]}: TPSpec mode='auto' needs tp_mode_fn")
            if spec.mode != "auto":
                self._tp_mode[pid] = resolve_mode(spec, p, None, names[pid])
                self.tp_modes[names[pid]] = self._tp_mode[pid].value

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
        handle_nonfinite(events, cfg.nonfinite_policy, self.nonfinite_events)
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

    # ---------------------------------------------------------------------------- speculative Newton-Schulz
    @torch.no_grad()
    def speculate(self, params: list[torch.Tensor], grads: list[torch.Tensor], *, stream: Any = None) -> None:
        """Orthogonalize the coming step's NS input of `params` now, from their final gradients `grads`, so that
        the work can overlap whatever else runs (the backward of the layers below, on another CUDA `stream`).

        `params`: parameters the fused step takes (fp32 2-D, not TP-sharded, split only as `_fused_pieces` allows;
        one param group, shape and split);
        `grads`: the fp32 tensors that will be their `.grad` at the step, values final. Nothing of the optimizer
        state changes (the momentum is written at the step: `momentum_pack(write_buf=False)`). The next `step()`
        uses the result only if the caller then calls `confirm_speculation()` (the gradients were not modified
        since, e.g. not clipped) and each parameter's `.grad` and momentum buffer are still those tensors;
        otherwise it computes the NS input again, as without speculation. With `stream`, the work waits for the
        current stream, is enqueued on `stream`, and the step waits for it."""
        from optim.kernels import fused_step as fs

        if not params:
            return
        if not self._fused_available():
            raise ValueError(
                f"speculate: {type(self).__name__} is not on its fused step (CUDA, fused_step=True)"
            )
        groups = self._fused_groups()
        names = None
        g0: dict[str, Any] = groups.get(id(params[0]), {})
        shape = tuple(params[0].shape)
        pieces = self._fused_pieces(params[0])
        pending = {id(p) for sp in self._spec for p in sp.params}
        for p, g in zip(params, grads, strict=True):
            problem = None
            if id(p) not in groups:
                problem = (
                    "not a parameter of the fused step (fp32 2-D, not TP-sharded, no uneven or interleaved split, "
                    "decoupled decay)"
                )
            elif groups[id(p)] is not g0 or tuple(p.shape) != shape or self._fused_pieces(p) != pieces:
                problem = f"params must share one param group, shape {shape} and split"
            elif g.shape != p.shape or g.dtype != torch.float32 or not g.is_contiguous():
                problem = f"gradient must be fp32 contiguous of shape {shape}, got {g.dtype} {tuple(g.shape)}"
            elif id(p) in pending:
                problem = "already speculated for this step"
            if problem:
                names = names or param_names(self.param_groups)
                raise ValueError(f"speculate: {names.get(id(p), '<unknown parameter>')}: {problem}")
        bufs = []
        for p in params:  # state created on the current stream, like the step's
            st = self.state[p]
            if not st:
                st["step"], st["momentum_buffer"] = 0, torch.zeros_like(p)
            bufs.append(st["momentum_buffer"])
        orthogonalize = self._spec_orthogonalize or self._orthogonalize
        side = stream is not None and params[0].is_cuda
        if side:
            stream.wait_stream(torch.cuda.current_stream(params[0].device))
        with torch.cuda.stream(stream) if side else contextlib.nullcontext():
            x = fs.momentum_pack(
                grads,
                bufs,
                beta=g0["momentum"],
                nesterov=self.config.nesterov,
                transpose=shape[0] > shape[1],
                checked=True,
                write_buf=False,
            )
            amax = torch._foreach_norm([x], float("inf"))[0]
            orth, mscale = orthogonalize(self._as_pieces(params[0], x))
            del x
            done = None
            if side:
                done = torch.cuda.Event()  # type: ignore[no-untyped-call]
                done.record(stream)
        self._spec.append(_Speculation(g0, list(params), bufs, list(grads), orth, mscale, amax, done))

    def confirm_speculation(self) -> None:
        """The gradients given to `speculate` since the last step are unchanged and are this step's (no clipping, no
        further accumulation): the next `step()` may use the speculative results. One-shot, like
        `assume_finite_grads`."""
        self._spec_confirmed = True

    def discard_speculation(self) -> None:
        """Drop pending speculative results (a step that will not run, gradients about to be zeroed); the current
        stream waits for their work first, so the gradients they read are not overwritten under them."""
        self._spec_confirmed = False
        self._take_speculation()  # unconfirmed: waits, counts them as discarded, returns nothing

    def _take_speculation(self) -> list[_Speculation]:
        """Pending results for this step (empty unless confirmed; counts reset), the current stream made to wait
        for their work; the speculation list is emptied."""
        spec, self._spec = self._spec, []
        confirmed, self._spec_confirmed = self._spec_confirmed, False
        self.spec_stats = {"used": 0, "discarded": 0}
        for sp in spec:
            if sp.done is not None:
                cur = torch.cuda.current_stream(sp.orth.device)
                cur.wait_event(sp.done)
                sp.orth.record_stream(cur)  # allocated on the speculation stream, freed after use on this one
        if not confirmed:
            self.spec_stats["discarded"] = sum(len(sp.params) for sp in spec)
            return []
        return spec

    # ------------------------------------------------------------------------------------ fused CUDA path
    def _fused_available(self) -> bool:
        """Whether this optimizer may take the fused CUDA path at all (subclasses opt in)."""
        return False

    def _fused_params(self) -> list[torch.Tensor]:
        """Parameters the fused path steps: fp32 contiguous 2-D matrices with an fp32 contiguous gradient, not
        TP-sharded, not split (or split as `_fused_pieces` allows), in a group with decoupled (or no) weight decay.
        (`optim.kernels.fused_step` runs its Triton kernels on CUDA tensors and its torch reference otherwise.) The
        parameter-side conditions are evaluated once per parameter set (and group weight decays); the gradient-side
        ones every step."""
        if not self._fused_available():
            return []
        fp32 = torch.float32
        return [
            p
            for p in self._fused_static_params()
            if (g := p.grad) is not None and g.dtype == fp32 and g.is_contiguous()
        ]

    def _fused_static_params(self) -> list[torch.Tensor]:
        """The parameter-side conditions of `_fused_params`, cached per parameter set (and group weight decays)."""
        cfg = self.config
        key = tuple(
            id(x)
            for group in self.param_groups
            for x in (group["weight_decay"] != 0 and cfg.weight_decay_method != "decoupled", *group["params"])
        )
        if self._fused_static is None or self._fused_static[0] != key:
            static = {
                id(p): (p, group)
                for group in self.param_groups
                if not (group["weight_decay"] != 0 and cfg.weight_decay_method != "decoupled")
                for p in group["params"]
                if p.ndim == 2
                and p.dtype == torch.float32
                and p.is_contiguous()
                and (id(p) not in self.splits or self._fused_pieces(p) > 1)
                and id(p) not in self.tp
            }
            self._fused_static = (
                key,
                [p for p, _ in static.values()],
                {i: g for i, (_, g) in static.items()},
            )
        return self._fused_static[1]

    def _fused_groups(self) -> dict[int, dict[str, Any]]:
        """id -> param group of every parameter the fused path may take (`_fused_static_params`)."""
        self._fused_static_params()
        assert self._fused_static is not None
        return self._fused_static[2]

    def _fused_pieces(self, p: torch.Tensor) -> int:
        """How many NS matrices the fused path makes of `p`: 1, or k for a split into k equal contiguous row blocks
        (`num_groups == 1`, e.g. gate / up of a fused fc1) of a wide matrix (rows <= cols), whose pieces are a free
        view (k, rows / k, cols) of the packed NS input; 0 for any other split (not fused: its pieces are not
        contiguous, or a tall matrix's wide orientation interleaves them)."""
        split = self.splits.get(id(p))
        if split is None:
            return 1
        uniform = split.num_groups == 1 and len(set(split.sizes)) == 1 and len(split.sizes) > 1
        return len(split.sizes) if uniform and p.size(0) <= p.size(1) else 0

    def _buckets_of(self, params: list[torch.Tensor], skipped: set[int]) -> list[_FusedBucket]:
        """(group, shape, split pieces, device) buckets of `params` less `skipped` ids, momentum state created where missing;
        cached for the common case (nothing skipped) until the parameter list or the state changes (a new state
        dict, entries added or removed; `load_state_dict` drops the cache itself)."""
        key = (*map(id, params), id(self.state), len(self.state))
        if not skipped and self._fused_buckets is not None and self._fused_buckets[0] == key:
            return self._fused_buckets[1]
        ids = set(key) - skipped
        buckets: dict[tuple[int, tuple[int, ...], int, torch.device], _FusedBucket] = {}
        for group in self.param_groups:
            for p in group["params"]:
                if id(p) not in ids:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["momentum_buffer"] = torch.zeros_like(p)
                bkey = (id(group), tuple(p.shape), self._fused_pieces(p), p.device)
                b = buckets.get(bkey)
                if b is None:
                    b = buckets[bkey] = _FusedBucket(group, [], [])
                b.params.append(p)
                b.bufs.append(st["momentum_buffer"])
        out = list(buckets.values())
        # the fused kernels' contract, checked once per build instead of per tensor every step
        for b in out:
            if not all(t.dtype == torch.float32 and t.is_contiguous() for t in b.bufs):
                raise ValueError(
                    f"momentum buffers of the fused Muon path must be contiguous fp32 (shape {tuple(b.params[0].shape)})"
                )
        if not skipped:
            self._fused_buckets = (key, out)
        return out

    def _fused_step(
        self,
        params: list[torch.Tensor],
        *,
        grads_known_finite: bool = False,
        spec: list[_Speculation] | None = None,
    ) -> None:
        """Step `params` with the fused kernels of `optim.kernels.fused_step`, one bucket per (group, shape):

        momentum update in place + bf16 NS input in one pass (`momentum_pack`), one `_orthogonalize` call on the
        (B, r, c) bf16 stack (stored (B, c, r) for tall matrices: the NS runs on the short side without transpose
        copies), then p <- p (1 - lr wd) - lr scale O in one pass (`apply_update`). ~24 bytes per
        element instead of ~70 through separate foreach, stack, cast, scale and update kernels. Differences from
        the unfused path: the NS input is rounded to bf16 before the Frobenius normalization (the bf16 NS rounds
        it after), and decay and update are one multiply-add (fp32 rounding).

        Non-finite handling as the unfused path: gradients are screened first (one host sync, per parameter);
        a parameter with a NaN/Inf gradient keeps its weight and momentum (skip) or raises; skipped when the caller
        vouched for the gradients (`assume_finite_grads`). The momentum is
        updated in place, so a momentum that overflows fp32 from finite gradients (screened on the NS input,
        a second sync) cannot be rolled back: that raises `NonFiniteError` whatever the policy."""
        from optim.kernels import fused_step as fs
        from optim.optimizers.base import NonFiniteError

        cfg = self.config
        # max-abs norms: NaN/Inf propagate, and unlike an L1 norm they cannot overflow on finite values
        if grads_known_finite:
            finite = [True] * len(params)
        else:
            amax = torch._foreach_norm([p.grad for p in params], float("inf"))  # type: ignore[misc]
            finite = torch.isfinite(torch.stack(amax)).tolist()  # one host sync
        skipped = {id(p) for p, ok in zip(params, finite, strict=True) if not ok}
        events = []
        if skipped:
            names = param_names(self.param_groups)  # only events need names
            events = [
                (names[id(p)], self.state[p].get("step", 0) + 1, "grad") for p in params if id(p) in skipped
            ]
        usable = self._usable_speculation(params, skipped, spec or [])
        done = {id(p) for sp in usable for p in sp.params}
        buckets = self._buckets_of([p for p in params if id(p) not in done] if done else params, skipped)
        handle_nonfinite(events, cfg.nonfinite_policy, self.nonfinite_events)
        for p in params:
            st = self.state[p]
            if st:
                st["step"] += 1
            else:  # a skipped parameter's first step: its state starts here, as on the unfused path
                st["step"], st["momentum_buffer"] = 1, torch.zeros_like(p)
        packed = []
        for b in buckets:
            ps = b.params
            x = fs.momentum_pack(
                [p.grad for p in ps],  # type: ignore[misc]
                b.bufs,
                beta=b.group["momentum"],
                nesterov=cfg.nesterov,
                transpose=ps[0].size(0) > ps[0].size(1),  # NS input in its wide orientation
                checked=True,
            )
            packed.append((b.group, ps, x))
        if not packed and not usable:
            return
        amaxes = [sp.amax for sp in usable]
        if packed:
            amaxes += torch._foreach_norm([x for _, _, x in packed], float("inf"))
        if not all(host_flags([torch.isfinite(torch.stack(amaxes)).all()])):
            names = param_names(self.param_groups)
            every = [p for _, ps, _ in packed for p in ps] + [p for sp in usable for p in sp.params]
            raise NonFiniteError([(names[id(p)], self.state[p]["step"], "momentum") for p in every])
        self._apply_speculation(usable)
        packed.reverse()
        while packed:  # pop, so that each bf16 stack is freed once its bucket is orthogonalized
            group, ps, x = packed.pop()
            orth, mscale = self._orthogonalize(self._as_pieces(ps[0], x))
            del x
            self._apply_fused_update(group, ps, orth, mscale)

    def _as_pieces(self, p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The packed (B, rows, cols) NS input of a bucket of parameters shaped like `p`, as (B k, rows / k, cols)
        for a split into k equal row blocks (`_fused_pieces`; a view, nothing copied)."""
        k = self._fused_pieces(p)
        return x if k == 1 else x.view(-1, x.size(1) // k, x.size(2))

    def _apply_fused_update(
        self, group: dict[str, Any], ps: list[torch.Tensor], orth: torch.Tensor, mscale: torch.Tensor | None
    ) -> None:
        """p <- p (1 - lr wd) - lr scale (mscale) O for one same-shape bucket (`fused_step.apply_update`)."""
        from optim.kernels import fused_step as fs

        if mscale is not None:
            orth = orth * mscale.to(orth.dtype).view(-1, 1, 1)
        rows, cols = ps[0].shape
        k = self._fused_pieces(ps[0])
        wd = group["weight_decay"] if self.config.weight_decay_method == "decoupled" else 0.0
        fs.apply_update(
            ps,
            orth.reshape(len(ps), rows, cols) if k > 1 else orth,
            lr=group["lr"],
            weight_decay=wd,
            scale=self._shape_scale(rows // k, cols),  # a split's pieces are scaled by their own shape
            transposed=ps[0].size(0) > ps[0].size(1),
            checked=True,
        )

    def _usable_speculation(
        self, params: list[torch.Tensor], skipped: set[int], spec: list[_Speculation]
    ) -> list[_Speculation]:
        """The confirmed speculative results this step can use: every parameter stepped now and not skipped, its
        `.grad` and momentum buffer still the tensors the speculation read. The rest are counted as discarded
        (their parameters take the ordinary path)."""
        if not spec:
            return []
        stepped = {id(p) for p in params} - skipped
        usable = []
        for sp in spec:
            ok = all(
                id(p) in stepped
                and (g := p.grad) is not None
                and g.data_ptr() == sg.data_ptr()
                and g.shape == sg.shape
                and self.state[p].get("momentum_buffer") is b
                for p, sg, b in zip(sp.params, sp.grads, sp.bufs, strict=True)
            )
            if ok:
                usable.append(sp)
                self.spec_stats["used"] += len(sp.params)
            else:
                self.spec_stats["discarded"] += len(sp.params)
        return usable

    def _apply_speculation(self, usable: list[_Speculation]) -> None:
        """Momentum written (the EMA the speculative NS input assumed) and the update applied, per speculation."""
        for sp in usable:
            torch._foreach_lerp_(sp.bufs, sp.grads, 1.0 - sp.group["momentum"])
            self._apply_fused_update(sp.group, sp.params, sp.orth, sp.mscale)

    def _momentum(self, skip: set[int] | None = None) -> list[_Entry]:
        """New momentum and orthogonalization input of every parameter with a gradient (state not yet written),
        except the parameters in `skip` (ids; stepped by the fused path)."""
        cfg = self.config
        skip = skip or set()
        entries: list[_Entry] = []
        for group in self.param_groups:
            beta, wd = group["momentum"], group["weight_decay"]
            ps = [p for p in group["params"] if p.grad is not None and id(p) not in skip]
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

    def _tp_groups(self, entries: list[_Entry]) -> list[Any]:
        """The distinct process groups (size > 1) of the TP-sharded entries, in first-seen order."""
        out: list[Any] = []
        for e in entries:
            spec = self.tp.get(id(e.p))
            if (
                spec is not None
                and spec.group is not None
                and spec.size() > 1
                and all(spec.group is not g for g in out)
            ):
                out.append(spec.group)
        return out

    def _orthogonalize_all(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """Whole matrices by `_orthogonalize_plain`, TP shards by `_orthogonalize_sharded`, in input order."""
        if not self.tp:
            return self._orthogonalize_plain(items)
        sharded = [id(p) in self.tp for p, _ in items]
        outs = iter(self._orthogonalize_plain([it for it, s in zip(items, sharded, strict=True) if not s]))
        tp_outs = iter(self._orthogonalize_sharded([it for it, s in zip(items, sharded, strict=True) if s]))
        return [next(tp_outs) if s else next(outs) for s in sharded]

    def _tp_mode_of(self, p: torch.Tensor) -> TPMode:
        mode = self._tp_mode.get(id(p))
        if mode is None:
            name = param_names(self.param_groups)[id(p)]
            mode = resolve_mode(self.tp[id(p)], p, self.tp_mode_fn, name)
            self._tp_mode[id(p)] = mode
            self.tp_modes[name] = mode.value
        return mode

    def _orthogonalize_sharded(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """TP shards: split, one `_orthogonalize_tp` call per (local shape, spec, mode), full-shape scale, merge.

        Every rank of a TP group must step the same sharded parameters in the same order (collectives)."""
        pieces: list[list[torch.Tensor]] = []
        buckets: dict[Hashable, list[tuple[int, int]]] = {}
        for i, (p, m) in enumerate(items):
            spec, mode = self.tp[id(p)], self._tp_mode_of(p)
            split = self.splits.get(id(p))
            parts = split.split(m) if split is not None else [m]
            pieces.append(parts)
            for j, part in enumerate(parts):
                key = (
                    tuple(part.shape[-2:]),
                    spec.dim,
                    id(spec.group),
                    spec.shard_sizes,
                    mode,
                    part.dtype,
                    part.device,
                    split is None,
                )
                buckets.setdefault(key, []).append((i, j))
        for idxs in buckets.values():
            parts = [pieces[i][j] for i, j in idxs]
            spec, mode = self.tp[id(items[idxs[0][0]][0])], self._tp_mode[id(items[idxs[0][0]][0])]
            views = [part.reshape(-1, *part.shape[-2:]) for part in parts]
            x = (views[0] if len(views) == 1 else torch.cat(views)).contiguous()
            # A split part of a row-sharded parameter is sharded in equal per-rank blocks (checked at construction).
            sizes = (
                spec.shard_sizes
                if self.splits.get(id(items[idxs[0][0]][0])) is None or spec.dim == -1
                else None
            )
            orth, mscale = self._orthogonalize_tp(x, mode=mode, spec=spec, shard_sizes=sizes)
            # Blockwise: the shard is the matrix (equals per-shard Muon, as MCore's blockwise).
            rows, cols = x.shape[-2:]
            if mode == TPMode.BLOCKWISE:
                pass
            elif spec.dim == -2:
                rows = sum(sizes) if sizes is not None else rows * spec.size()
            else:
                cols = sum(sizes) if sizes is not None else cols * spec.size()
            orth = orth * self._shape_scale(rows, cols)
            if mscale is not None:
                orth.mul_(mscale.view(-1, 1, 1))
            outs = torch.split(orth, [v.size(0) for v in views])
            for (i, j), o, part in zip(idxs, outs, parts, strict=True):
                pieces[i][j] = o.reshape(part.shape)
        result = []
        for (p, _), parts_out in zip(items, pieces, strict=True):
            split = self.splits.get(id(p))
            result.append(split.merge(parts_out) if split is not None else parts_out[0])
        return result

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
