"""Muon: MomentUm Orthogonalized by Newton-Schulz (Jordan 2024; Moonlight arXiv 2502.16982).

Semantics of emerging-optimizers 0.3.0 `Muon` (EMA momentum, decoupled weight decay, scale modes), with
three deliberate differences: all matrices of one shape are orthogonalized in one batched call instead of a Python
loop over parameters, momentum of bf16/fp16 parameters is kept in fp32, and Newton-Schulz steps beyond a
coefficient set's length repeat its last tuple (EO starts the set over, which leaves the singular values far
from 1). On CUDA, `optim.kernels` is used when
that package is importable and reports itself available (bf16 iterate only); otherwise plain torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from optim.configs import MuonConfig, TPMode
from optim.functional.newton_schulz import newton_schulz, ns_coefficients
from optim.functional.split import RowSplit
from optim.optimizers.base import config_from
from optim.optimizers.fused import FusedStep
from optim.optimizers.orthogonalized import OrthogonalizedOptimizer
from optim.optimizers.tp import TPModeFn, TPSpec

if TYPE_CHECKING:
    from optim.kernels.ns_batched import LastProduct

_kernels: Any
try:
    from optim import kernels as _kernels
except ImportError:
    _kernels = None

NS_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def kernels_available() -> bool:
    """True when the optional CUDA kernels package imports and says it can run here."""
    return _kernels is not None and bool(_kernels.available())


class Muon(OrthogonalizedOptimizer):
    """Muon over 2-D matrices and 3-D expert stacks.

    Args:
        params: tensors, (name, tensor) pairs, or param-group dicts; groups may override lr, momentum and
            weight_decay.
        config: algorithm settings (see MuonConfig), or the learning rate as torch.optim.Muon's second argument.
        **hyperparameters: MuonConfig fields as keywords (lr, momentum, nesterov, weight_decay, eps, num_ns_steps,
            ...), as torch.optim.Muon takes them; given with `config`, they replace its fields.
        splits: fused parameters to split before orthogonalization (see optim.routing).
        tp: tensor-parallel shards (see optim.optimizers.tp.TPSpec): orthogonalized by `tp_newton_schulz` in the
            spec's mode with this config's coefficients, steps, eps and precision, scaled by the full shape.
        tp_mode_fn: picks the mode of `mode="auto"` specs, `(rows, cols, tp, partition_dim) -> mode`.
    """

    config: MuonConfig

    def __init__(
        self,
        params: Any,
        config: MuonConfig | float | None = None,
        *,
        splits: Mapping[torch.Tensor, RowSplit] | None = None,
        tp: Mapping[torch.Tensor, TPSpec] | None = None,
        tp_mode_fn: TPModeFn | None = None,
        **hyperparameters: Any,
    ) -> None:
        config = config_from(MuonConfig, config, hyperparameters)
        super().__init__(params, config, splits=splits, tp=tp, tp_mode_fn=tp_mode_fn)
        custom = config.custom_coefficients if config.coefficient_type == "custom" else None
        self.coefficients = ns_coefficients(config.coefficient_type, config.num_ns_steps, custom)
        self._kernels_ok: bool | None = None
        if self._fused_available():
            self.fused = FusedStep(self)

    def assume_finite_grads(self) -> None:
        """The caller has established that every gradient of the coming step is finite (Megatron's wrapper: a finite
        global gradient norm, which bounds every element); the next `step()` skips the fused path's gradient screen
        and its host sync. One-shot: consumed by that step. The momentum-overflow check stays."""
        if self.fused is not None:
            self.fused.grads_known_finite = True

    def speculate(self, params: list[torch.Tensor], grads: list[torch.Tensor], *, stream: Any = None) -> None:
        """Orthogonalize the coming step's NS input of `params` now, from their final gradients `grads`, so that
        the work can overlap whatever else runs (the backward of the layers below, on another CUDA `stream`).

        `params`: parameters the fused step takes (fp32 2-D, not TP-sharded, split only into equal row blocks of a
        wide matrix; one param group, shape and split); `grads`: the fp32 tensors that will be their `.grad` at the
        step, values final. Nothing of the optimizer state changes (the momentum is written at the step). The next
        `step()` uses the result only if the caller then calls `confirm_speculation()` (the gradients were not
        modified since, e.g. not clipped) and each parameter's `.grad` and momentum buffer are still those tensors;
        otherwise it computes the NS input again. With `stream`, the work waits for the current stream, is
        enqueued on `stream`, and the step waits for it (`optim.optimizers.speculative`)."""
        if self.fused is None:
            raise ValueError(f"speculate: {type(self).__name__} is not on its fused step (CUDA, fused_step=True)")
        self.fused.speculation.speculate(params, grads, stream=stream)

    def confirm_speculation(self) -> None:
        """The gradients given to `speculate` since the last step are unchanged and are this step's (no clipping, no
        further accumulation): the next `step()` may use the speculative results. One-shot."""
        if self.fused is not None:
            self.fused.speculation.confirmed = True

    def discard_speculation(self) -> None:
        """Drop pending speculative results (a step that will not run, gradients about to be zeroed); the current
        stream waits for their work first, so the gradients they read are not overwritten under them."""
        if self.fused is not None:
            self.fused.speculation.confirmed = False
            self.fused.speculation.take()  # unconfirmed: waits, counts them as discarded, returns nothing

    @property
    def spec_stats(self) -> dict[str, int]:
        """Matrices whose speculative NS the last step used / threw away (reset at each step)."""
        return self.fused.speculation.stats if self.fused is not None else {"used": 0, "discarded": 0}

    def _use_kernels(self, x: torch.Tensor) -> bool:
        """Dispatch predicate: CUDA input, bf16 or fp16 iterate, and `optim.kernels` available (checked once)."""
        if not (x.is_cuda and self.config.ns_precision in ("bf16", "fp16")):
            return False
        if self._kernels_ok is None:
            self._kernels_ok = kernels_available()
        return self._kernels_ok

    def _fused_available(self) -> bool:
        """Whether Muon builds its fused CUDA step (`FusedStep`, at construction): config.fused_step, bf16 or fp16 NS
        and the kernels (the fused pack writes a bf16 NS input; an fp16 iterate is scaled and cast from it)."""
        return (
            bool(self.config.fused_step)
            and self.config.ns_precision in ("bf16", "fp16")
            and kernels_available()
        )

    def _ns_settings(self) -> dict[str, Any]:
        """This config's NS as `newton_schulz` and `tp_newton_schulz` take it."""
        cfg = self.config
        return {
            "num_ns_steps": cfg.num_ns_steps,
            "coefficients": self.coefficients,
            "compute_dtype": NS_DTYPES[cfg.ns_precision],
            "eps": cfg.eps,
            "use_gram": cfg.use_gram_ns,
            "restart_iterations": cfg.gram_restart_iterations,
        }

    def _kernel_settings(self) -> dict[str, Any]:
        """This config's NS as `optim.kernels.orthogonalize` (and `orthogonalize_deferred`) take it."""
        cfg = self.config
        return {
            "coeffs": self.coefficients,
            "eps": cfg.eps,
            "use_gram": cfg.use_gram_ns,
            "restart_iterations": cfg.gram_restart_iterations,
            "dtype": NS_DTYPES[cfg.ns_precision],
        }

    def _orthogonalize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One call per shape group (the base class stacks the group): (B, m, n) -> orthogonalized stack."""
        if self._use_kernels(x):
            assert _kernels is not None
            sumsq = self.fused.packed_sumsq if self.fused is not None else None  # the fused pack's norms of x
            out = _kernels.orthogonalize(x, sumsq=sumsq, **self._kernel_settings())
            return out.to(x.dtype), None
        return newton_schulz(x, **self._ns_settings()), None

    def _ns_deferred(self, x: torch.Tensor, sumsq: torch.Tensor) -> LastProduct | None:
        """The fused step's NS of a packed stack stopped before its last product, which then writes the update
        into the parameters (`optim.kernels.orthogonalize_deferred`); None where the planned method cannot."""
        if not self._use_kernels(x):
            return None
        assert _kernels is not None
        last: LastProduct | None = _kernels.orthogonalize_deferred(x, sumsq, **self._kernel_settings())
        return last

    def _orthogonalize_tp(
        self, x: torch.Tensor, *, mode: TPMode, spec: TPSpec, shard_sizes: tuple[int, ...] | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, r, c) TP shards -> orthogonalized shards (`tp_newton_schulz` with this config's NS settings)."""
        return spec.newton_schulz(x, mode=mode, shard_sizes=shard_sizes, **self._ns_settings()), None
