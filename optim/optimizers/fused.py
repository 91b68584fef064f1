"""Fused CUDA step of Muon: whole fp32 2-D matrices stepped by `optim.kernels.fused_step`.

Muon with `fused_step` on CUDA, bf16 NS (`_fused_step`): whole fp32 2-D matrices (not TP-sharded; split only into
equal contiguous row blocks of a wide matrix, e.g. gate / up, whose pieces are a view of the packed stack) are
stepped one (group, shape, split) bucket at a time: momentum update in place plus the bf16 NS input in one pass,
one batched orthogonalize, decay and scaled update in one pass. It differs from the reference step
(`OrthogonalizedOptimizer.step`) by rounding: the NS input is rounded to bf16 before the Frobenius normalization,
and decay and update are one multiply-add. Its non-finite check screens the gradients first (see `_fused_step`).
Tested against the reference in tests/unit/test_muon_fused.py and tests/gpu/test_kernels_gpu.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from optim.optimizers.base import handle_nonfinite, host_flags, param_names

if TYPE_CHECKING:
    from optim.functional.split import RowSplit
    from optim.optimizers.speculative import _Speculation
    from optim.optimizers.tp import TPSpec


@dataclass(slots=True)
class _FusedBucket:
    """Parameters of one (group, shape, split pieces, device) stepped together by the fused path, and their momentum
    buffers."""

    group: dict[str, Any]
    params: list[torch.Tensor]
    bufs: list[torch.Tensor]


class FusedStepMixin(torch.optim.Optimizer):
    """The fused CUDA path of `OrthogonalizedOptimizer` (its `__init__` sets the attributes declared here)."""

    if TYPE_CHECKING:
        config: Any
        splits: dict[int, RowSplit]
        tp: dict[int, TPSpec]
        nonfinite_events: list[tuple[str, int, str]]
        _fused_static: tuple[tuple[int, ...], list[torch.Tensor], dict[int, dict[str, Any]]] | None
        _fused_buckets: tuple[tuple[int, ...], list[_FusedBucket]] | None
        _packed_sumsq: torch.Tensor | None

        def _orthogonalize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]: ...
        def _shape_scale(self, rows: int, cols: int) -> float: ...
        def _usable_speculation(
            self, params: list[torch.Tensor], skipped: set[int], spec: list[_Speculation]
        ) -> list[_Speculation]: ...
        def _apply_speculation(self, usable: list[_Speculation]) -> None: ...

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

        momentum update in place + bf16 NS input + each NS matrix's squared norm in one pass
        (`momentum_pack_with_norms`), one `_orthogonalize` call on the (B, r, c) bf16 stack (stored (B, c, r) for
        tall matrices: the NS runs on the short side without transpose copies), normalized with those norms (no
        norm pass), then p <- p (1 - lr wd) - lr scale O in one pass (`apply_update`). ~24 bytes per element
        instead of ~70 through separate foreach, stack, cast, scale and update kernels. Differences from the
        unfused path: the NS input is rounded to bf16 before the Frobenius normalization (the bf16 NS rounds it
        after), and decay and update are one multiply-add (fp32 rounding).

        Non-finite handling as the unfused path: gradients are screened first (`fused_step.nonfinite`, one launch
        per bucket and one host sync); a parameter with a NaN/Inf gradient keeps its weight and momentum (skip) or
        raises; no screen when the caller vouched for the gradients (`assume_finite_grads`). The momentum is
        updated in place, so a momentum that overflows fp32 from finite gradients cannot be rolled back: that
        raises `NonFiniteError` whatever the policy, before any weight is written. Its screen is the pack's norms
        (a NaN/Inf makes a norm non-finite), read with one host sync once every NS of the step is queued, so the
        GPU does not wait on the host between the pack and the NS."""
        from optim.kernels import fused_step as fs

        cfg = self.config
        # Host work that does not depend on the screen is done before its sync: the buckets (cached), the state.
        every = self._buckets_of(params, set())
        skipped: set[int] = set()
        if not grads_known_finite:
            flags = [fs.nonfinite([p.grad for p in b.params], checked=True) for b in every]  # type: ignore[misc]
            bad = torch.cat(flags).tolist()  # one host sync
            ordered = [p for b in every for p in b.params]
            skipped = {id(p) for p, f in zip(ordered, bad, strict=True) if f}
        events = []
        if skipped:
            names = param_names(self.param_groups)  # only events need names
            events = [
                (names[id(p)], self.state[p].get("step", 0) + 1, "grad") for p in params if id(p) in skipped
            ]
        handle_nonfinite(events, cfg.nonfinite_policy, self.nonfinite_events)
        usable = self._usable_speculation(params, skipped, spec or [])
        done = {id(p) for sp in usable for p in sp.params}
        buckets = (
            every
            if not (done or skipped)
            else self._buckets_of([p for p in params if id(p) not in done], skipped)
        )
        for p in params:
            self.state[p]["step"] += 1  # `_buckets_of(params, ...)` created every missing state
        packed = []
        for b in buckets:
            ps = b.params
            k = self._fused_pieces(ps[0])
            x, sumsq = fs.momentum_pack_with_norms(
                [p.grad for p in ps],  # type: ignore[misc]
                b.bufs,
                beta=b.group["momentum"],
                nesterov=cfg.nesterov,
                transpose=ps[0].size(0) > ps[0].size(1),  # NS input in its wide orientation
                pieces=k,
                checked=True,
            )
            packed.append((b, x, sumsq))
        if not packed and not usable:
            return
        screens = [sp.amax for sp in usable] + [s for _, _, s in packed]
        packed.reverse()
        orths = []
        while packed:  # pop, so that each bf16 stack is freed once its bucket is orthogonalized
            b, x, sumsq = packed.pop()
            self._packed_sumsq = sumsq
            try:
                orth, mscale = self._orthogonalize(self._as_pieces(b.params[0], x))
            finally:
                self._packed_sumsq = None
            del x
            orths.append((b, orth, mscale))
        if not all(host_flags([torch.isfinite(torch.cat([s.reshape(-1) for s in screens])).all()])):
            self._raise_if_momentum_nonfinite(usable, [b for b, _, _ in orths])
        self._apply_speculation(usable)
        for b, orth, mscale in orths:
            self._apply_fused_update(b.group, b.params, orth, mscale)

    def _raise_if_momentum_nonfinite(self, usable: list[_Speculation], buckets: list[_FusedBucket]) -> None:
        """The momentum screen failed: raise `NonFiniteError` if a momentum buffer of the step holds a NaN/Inf, or
        a speculative NS input did (its momentum is written only after this check); otherwise a norm overflowed
        fp32 from finite values larger than ~1e19, and the step goes on."""
        from optim.optimizers.base import NonFiniteError

        bufs = [buf for b in buckets for buf in b.bufs]
        checks = [torch.isfinite(a) for a in torch._foreach_norm(bufs, float("inf"))] if bufs else []
        checks += [torch.isfinite(sp.amax) for sp in usable]
        if not all(host_flags(checks)):
            names = param_names(self.param_groups)
            every = [p for b in buckets for p in b.params] + [p for sp in usable for p in sp.params]
            raise NonFiniteError([(names[id(p)], self.state[p]["step"], "momentum") for p in every])

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
