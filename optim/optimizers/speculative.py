"""Speculative Newton-Schulz: a layer's NS computed during the backward, used by the fused step if still valid.

`Speculation.speculate(params, grads, stream=...)` orthogonalizes the coming step's NS input of a set of fused-path
parameters from their final gradients, on a side stream, without touching the optimizer state; `confirm()` says the
gradients were not changed since (no clipping); the next fused step (`FusedStep.step`) uses each result only if its
parameters' `.grad` and momentum buffers are still the tensors it read, and computes the rest as without
speculation. The optimizer's `speculate` / `confirm_speculation` / `discard_speculation` are this object's.
Tested against the plain step in tests/unit/test_muon_fused.py and tests/gpu/test_megatron_smoke.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from optim.optimizers.base import param_names
from optim.optimizers.protocols import FusedStepView


@dataclass(slots=True)
class _Speculation:
    """The orthogonalized NS input of a same-(group, shape) set of parameters, computed before the step from final
    gradients and the momentum as it was (`Speculation.speculate`)."""

    group: dict[str, Any]
    params: list[torch.Tensor]
    bufs: list[torch.Tensor]
    """Their momentum buffers at speculation time (the step uses the result only if they are still the state's)."""
    grads: list[torch.Tensor]
    """The gradient tensors the input was computed from: the step uses the result only if each parameter's `.grad`
    is still that tensor (same storage) and the caller confirmed the values unchanged (`confirm`)."""
    orth: torch.Tensor
    mscale: torch.Tensor | None
    amax: torch.Tensor
    """Max-abs of the NS input (0-d, on the device): the step's momentum-overflow check."""
    done: Any = None
    """CUDA event recorded after the work on the speculation stream (None on CPU or the current stream)."""


class Speculation:
    """Pending speculative results of one optimizer's fused step, their confirmation and per-step counts."""

    def __init__(self, fused: FusedStepView) -> None:
        self.fused = fused
        self.pending: list[_Speculation] = []
        self.confirmed = False
        self.orthogonalize: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]] | None = None
        """The orthogonalize function speculation calls (instrumented apart from the step's); None: the step's."""
        self.stats: dict[str, int] = {"used": 0, "discarded": 0}
        """Matrices whose speculative NS the last step used / threw away (reset at each step)."""

    @torch.no_grad()
    def speculate(self, params: list[torch.Tensor], grads: list[torch.Tensor], *, stream: Any = None) -> None:
        """Orthogonalize the coming step's NS input of `params` now, from their final gradients `grads` (see
        `Muon.speculate`)."""
        from optim.kernels import fused_step as fs

        if not params:
            return
        opt, fused = self.fused.opt, self.fused
        groups = fused.groups()
        names = None
        g0: dict[str, Any] = groups.get(id(params[0]), {})
        shape = tuple(params[0].shape)
        pieces = fused.pieces(params[0])
        pending = {id(p) for sp in self.pending for p in sp.params}
        for p, g in zip(params, grads, strict=True):
            problem = None
            if id(p) not in groups:
                problem = (
                    "not a parameter of the fused step (fp32 2-D, not TP-sharded, no uneven or interleaved split, "
                    "decoupled decay)"
                )
            elif groups[id(p)] is not g0 or tuple(p.shape) != shape or fused.pieces(p) != pieces:
                problem = f"params must share one param group, shape {shape} and split"
            elif g.shape != p.shape or g.dtype != torch.float32 or not g.is_contiguous():
                problem = f"gradient must be fp32 contiguous of shape {shape}, got {g.dtype} {tuple(g.shape)}"
            elif id(p) in pending:
                problem = "already speculated for this step"
            if problem:
                names = names or param_names(opt.param_groups)
                raise ValueError(f"speculate: {names.get(id(p), '<unknown parameter>')}: {problem}")
        bufs = []
        for p in params:  # state created on the current stream, like the step's
            st = opt.state[p]
            if not st:
                st["step"], st["momentum_buffer"] = 0, torch.zeros_like(p)
            bufs.append(st["momentum_buffer"])
        orthogonalize = self.orthogonalize or opt._orthogonalize
        side = stream is not None and params[0].is_cuda
        if side:
            stream.wait_stream(torch.cuda.current_stream(params[0].device))
        with torch.cuda.stream(stream) if side else contextlib.nullcontext():
            x = fs.momentum_pack(
                grads,
                bufs,
                beta=g0["momentum"],
                nesterov=opt.config.nesterov,
                transpose=shape[0] > shape[1],
                checked=True,
                write_buf=False,
            )
            amax = torch._foreach_norm([x], float("inf"))[0]
            orth, mscale = orthogonalize(fused.as_pieces(params[0], x))
            del x
            done = None
            if side:
                done = torch.cuda.Event()  # type: ignore[no-untyped-call]
                done.record(stream)
        self.pending.append(_Speculation(g0, list(params), bufs, list(grads), orth, mscale, amax, done))

    def take(self) -> list[_Speculation]:
        """Pending results for this step (empty unless confirmed; counts reset), the current stream made to wait
        for their work; the pending list is emptied and the confirmation consumed."""
        spec, self.pending = self.pending, []
        confirmed, self.confirmed = self.confirmed, False
        self.stats = {"used": 0, "discarded": 0}
        for sp in spec:
            if sp.done is not None:
                cur = torch.cuda.current_stream(sp.orth.device)
                cur.wait_event(sp.done)
                sp.orth.record_stream(cur)  # allocated on the speculation stream, freed after use on this one
        if not confirmed:
            self.stats["discarded"] = sum(len(sp.params) for sp in spec)
            return []
        return spec

    def usable(self, params: list[torch.Tensor], skipped: set[int], spec: list[_Speculation]) -> list[_Speculation]:
        """The confirmed results this step can use: every parameter stepped now and not skipped, its `.grad` and
        momentum buffer still the tensors the speculation read. The rest are counted as discarded (their
        parameters take the ordinary path)."""
        if not spec:
            return []
        state = self.fused.opt.state
        stepped = {id(p) for p in params} - skipped
        usable = []
        for sp in spec:
            ok = all(
                id(p) in stepped
                and (g := p.grad) is not None
                and g.data_ptr() == sg.data_ptr()
                and g.shape == sg.shape
                and state[p].get("momentum_buffer") is b
                for p, sg, b in zip(sp.params, sp.grads, sp.bufs, strict=True)
            )
            if ok:
                usable.append(sp)
                self.stats["used"] += len(sp.params)
            else:
                self.stats["discarded"] += len(sp.params)
        return usable

    def apply(self, usable: list[_Speculation]) -> None:
        """Momentum written (the EMA the speculative NS input assumed) and the update applied, per speculation."""
        for sp in usable:
            torch._foreach_lerp_(sp.bufs, sp.grads, 1.0 - sp.group["momentum"])
            self.fused.apply_update(sp.group, sp.params, sp.orth, sp.mscale)
