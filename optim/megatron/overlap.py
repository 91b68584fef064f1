"""Newton-Schulz overlapped with the backward: `NSOverlap` starts each layer's orthogonalization in the last
micro-batch's backward, as soon as that layer's gradients are final, on a second CUDA stream.

With gradient accumulation a parameter's gradient is final once its last micro-batch's backward has passed it: the
top layer's early in that backward, the bottom layer's at its end. Without overlap the whole NS waits for the
optimizer step. Here, armed by the caller just before the last micro-batch (`arm()`, from the forward-step
function), a hook on each matrix's gradient accumulator (registered after DDP's, so `main_grad` already holds the
sum) marks it final; when every matrix of a unit (one layer's matrices of one shape and param group) is,
`Muon.speculate` computes that unit's NS input and orthogonalization on the side stream while
the backward of the layers below goes on. Nothing of the optimizer state changes then. The hooks exist only during
that last backward, because hooks left on for every micro-batch cost host time in each of them.

The overlap hides NS only where the backward leaves the GPU idle; on one H200, whose backward already runs at the
power limit, the last micro-batch grows by the NS time (measurements: docs/megatron_h200.md, "Findings").

The step uses those results only if nothing changed the gradients after the hooks: the chain
(`optim.megatron.builders.finite_norm_chain`) confirms them when Megatron's global norm is finite and clipping does
not scale (`clip_grad / (norm + 1e-6) >= 1`, Megatron's test); otherwise the step recomputes from the clipped
gradients, exactly as without overlap. `begin()` (before each forward-backward) drops anything pending, so a step
that did not run (skipped update, evaluation) cannot leak stale results.

Where the gradients are final at the hook (checked at install): DP x CP = 1 (at DP > 1 DDP scales and reduces
them after the backward), no per-token loss scaling in `finalize_model_grads`, and no TP-domain all-reduce of the
matrix (`sequence_parallel` / `average_gradients_across_tp_domain` parameters are left to the step). Memory: the
orthogonalized stacks wait for the step (bf16, 2 bytes per matrix element, ~7 GB on the Qwen3 slice), allocated
while the backward's activations are still live.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from optim.optimizers.muon import Muon
from optim.optimizers.orthogonalized import OrthogonalizedOptimizer

_LAYER = re.compile(r"^(.*?layers\.\d+)\.")
# attributes of parameters whose gradient Megatron modifies after the backward (finalize_model_grads)
_POST_BACKWARD = ("sequence_parallel", "average_gradients_across_tp_domain", "shared_embedding")


@dataclass(slots=True)
class _Unit:
    name: str
    """"<layer prefix> <shape>" (or "<name> <shape>" outside a layer), for messages and the record."""
    main: list[torch.Tensor]
    model: list[torch.Tensor]
    pending: int = 0
    """Hook calls still due in the armed backward (len(model) at `arm`)."""
    launched: bool = False


@dataclass(slots=True)
class NSOverlap:
    """Hooks that start each unit's speculative NS once its gradients are final (see module docstring)."""

    optimizer: Muon
    units: list[_Unit]
    num_microbatches: int
    stream: Any = None
    grad_of: Callable[[torch.Tensor], torch.Tensor] = lambda p: p.main_grad  # type: ignore[attr-defined]
    """Model parameter -> its accumulated gradient (Megatron: `main_grad`)."""
    nodes: list[tuple[Any, Callable[..., None]]] = field(default_factory=list)
    """(gradient accumulator node of a model parameter, its hook), registered by `arm`."""
    handles: list[Any] = field(default_factory=list)
    launched: int = 0
    """Units started in the current step."""

    @classmethod
    def attach(
        cls,
        optimizer: OrthogonalizedOptimizer,
        pairs: list[tuple[str, torch.Tensor, torch.Tensor]],
        num_microbatches: int,
        *,
        grad_of: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> NSOverlap:
        """Units from (name, model parameter, optimizer parameter) triples, and the hook of every model parameter's
        gradient accumulator (registered by `arm`, after the accumulation hooks that must run first). Parameters
        the optimizer's fused step does not take are left out; none left is an error. `num_microbatches` is
        recorded for `describe` (the caller arms before the last one)."""
        if num_microbatches < 1:
            raise ValueError(f"num_microbatches={num_microbatches}: must be >= 1")
        fused = optimizer.fused
        groups = fused.groups() if fused is not None else {}
        by_key: dict[tuple[str, tuple[int, ...], int, int], _Unit] = {}
        for name, model_p, main_p in pairs:
            if id(main_p) not in groups or not model_p.requires_grad:
                continue
            m = _LAYER.match(name)
            prefix = m.group(1) if m else name
            assert fused is not None
            key = (prefix, tuple(main_p.shape), id(groups[id(main_p)]), fused.pieces(main_p))
            unit = by_key.get(key)
            if unit is None:
                unit = by_key[key] = _Unit(f"{prefix} {tuple(main_p.shape)}", [], [])
            unit.main.append(main_p)
            unit.model.append(model_p)
        if not by_key:
            raise ValueError(
                "ns_overlap: none of the given matrices is stepped by the optimizer's fused path (CUDA, "
                "fused_step=True, fp32 2-D, not TP-sharded, no uneven or interleaved split), nothing to overlap"
            )
        cuda = next(iter(by_key.values())).main[0].is_cuda
        device = next(iter(by_key.values())).main[0].device
        stream = torch.cuda.Stream(device=device) if cuda else None  # type: ignore[no-untyped-call]
        assert isinstance(optimizer, Muon)  # the only one with a fused step
        self = cls(optimizer, list(by_key.values()), num_microbatches, stream=stream)
        if grad_of is not None:
            self.grad_of = grad_of
        for unit in self.units:
            hook = self._hook(unit)
            for model_p in unit.model:
                # the AccumulateGrad node (kept alive here): its post-hooks run in registration order, after DDP's
                acc = model_p.expand_as(model_p).grad_fn.next_functions[0][0]  # type: ignore[union-attr]
                assert acc is not None, unit.name
                self.nodes.append((acc, hook))
        self.begin()
        return self

    def _hook(self, unit: _Unit) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            unit.pending -= 1
            if unit.pending == 0 and not unit.launched:
                unit.launched = True
                self.launched += 1
                self.optimizer.speculate(unit.main, [self.grad_of(p) for p in unit.model], stream=self.stream)

        return hook

    def begin(self) -> None:
        """Before each forward-backward: unhook, drop pending results."""
        self._disarm()
        self.optimizer.discard_speculation()
        self.launched = 0

    def arm(self) -> None:
        """Just before the last micro-batch (its forward; its backward follows in Megatron's no-pipelining
        schedule): hook every matrix's accumulator, so that the backward hands each final gradient over."""
        self._disarm()
        for unit in self.units:
            unit.pending, unit.launched = len(unit.model), False
        self.handles = [acc.register_hook(hook) for acc, hook in self.nodes]

    def _disarm(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def remove(self) -> None:
        """Unhook and drop pending results (the optimizer keeps working without overlap)."""
        self.begin()

    def describe(self) -> dict[str, Any]:
        return {
            "units": len(self.units),
            "matrices": sum(len(u.main) for u in self.units),
            "num_microbatches": self.num_microbatches,
            "stream": "side CUDA stream" if self.stream is not None else "current (CPU)",
        }


def install(chain: Any, model_chunks: list[Any], num_microbatches: int, config: Any) -> NSOverlap:
    """`NSOverlap` for our matrix optimizer inside `build_ours`' chain over the DDP-wrapped `model_chunks`
    (`config`: the TransformerConfig). Raises ValueError naming what prevents it (see module docstring). The caller
    calls `begin()` before each forward-backward and `arm()` before its last micro-batch."""
    from megatron.core import parallel_state as ps

    pp = ps.get_pipeline_model_parallel_world_size()
    if pp != 1:
        raise ValueError(
            f"optimizer.ns_overlap=true needs PP = 1 (got {pp}): it arms its hooks before the last micro-batch's "
            "forward, which is followed by that micro-batch's backward only in the no-pipelining schedule"
        )
    dp_cp = ps.get_data_parallel_world_size(with_context_parallel=True)
    if dp_cp != 1:
        raise ValueError(
            f"optimizer.ns_overlap=true needs DP x CP = 1 (got {dp_cp}): at DP > 1 DDP scales and reduces the "
            "gradients after the backward, so they are not final at the hooks"
        )
    for flag in ("calculate_per_token_loss", "flextron"):
        if getattr(config, flag, False):
            raise ValueError(f"optimizer.ns_overlap=true: {flag}=True rescales gradients after the backward")
    targets = list(getattr(chain, "finite_targets", []))
    found = [
        (w, w.optimizer)
        for w in getattr(chain, "chained_optimizers", [])
        if isinstance(getattr(w, "optimizer", None), OrthogonalizedOptimizer)
    ]
    if len(found) != 1 or found[0][1] not in targets:
        raise ValueError(
            "optimizer.ns_overlap=true: needs build_ours' chain with exactly one matrix optimizer in Megatron's main "
            f"gradient norm (found {len(found)}; layer-wise / hybrid optimizers are not supported)"
        )
    wrapper, inner = found[0]
    main_of = _main_params(wrapper)
    pairs = []
    for c, chunk in enumerate(model_chunks):
        for name, p in chunk.named_parameters():
            main_p = main_of.get(id(p))
            if main_p is None or any(getattr(p, a, False) for a in _POST_BACKWARD):
                continue
            if getattr(p, "main_grad", None) is None or p.main_grad.dtype != torch.float32:
                continue  # a bf16 main_grad is copied to a new fp32 .grad at the step: nothing to reuse
            pairs.append((f"chunk{c}.{name}", p, main_p))
    return NSOverlap.attach(inner, pairs, num_microbatches)


def _main_params(wrapper: Any) -> dict[int, torch.Tensor]:
    """id(model parameter) -> the parameter the inner optimizer steps (Megatron's fp32 copy of a bf16 one)."""
    out: dict[int, torch.Tensor] = {}
    f16 = getattr(wrapper, "float16_groups", None)
    if f16 is not None:
        for model_g, main_g in zip(f16, wrapper.fp32_from_float16_groups, strict=True):
            out.update({id(m): p for m, p in zip(model_g, main_g, strict=True)})
        for g in wrapper.fp32_from_fp32_groups:
            out.update({id(p): p for p in g})
        return out
    for g in wrapper.optimizer.param_groups:  # FP32Optimizer: the model's own parameters
        out.update({id(p): p for p in g["params"]})
    return out
