"""Speculative Newton-Schulz: a layer's NS computed during the backward, used by the step if still valid.

`speculate(params, grads, stream=...)` orthogonalizes the coming step's NS input of a set of fused-path parameters
from their final gradients, on a side stream, without touching the optimizer state; `confirm_speculation()` says the
gradients were not changed since (no clipping); the next `step()` uses each result only if its parameters' `.grad`
and momentum buffers are still the tensors it read, and computes the rest as without speculation. Tested against the
plain step in tests/unit/test_muon_fused.py and tests/gpu/test_megatron_smoke.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from optim.optimizers.base import param_names


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


class SpeculativeNSMixin(torch.optim.Optimizer):
    """The speculation protocol of `OrthogonalizedOptimizer` (its `__init__` sets the attributes declared here)."""

    if TYPE_CHECKING:
        config: Any
        _spec: list[_Speculation]
        _spec_confirmed: bool
        _spec_orthogonalize: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]] | None
        spec_stats: dict[str, int]

        def _orthogonalize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]: ...
        def _fused_available(self) -> bool: ...
        def _fused_groups(self) -> dict[int, dict[str, Any]]: ...
        def _fused_pieces(self, p: torch.Tensor) -> int: ...
        def _as_pieces(self, p: torch.Tensor, x: torch.Tensor) -> torch.Tensor: ...
        def _apply_fused_update(
            self,
            group: dict[str, Any],
            params: list[torch.Tensor],
            orth: torch.Tensor,
            mscale: torch.Tensor | None,
        ) -> None: ...

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
