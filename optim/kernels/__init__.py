"""Fast Newton-Schulz on the GPU: batched, plan-cached, with Triton symmetric products and CUDA graphs.

Public contract (used by the optimizers):
- `available()`: CUDA present and Triton importable.
- `orthogonalize_deferred(x, sumsq, *, coeffs, eps, use_gram, restart_iterations)`: the same for a packed wide
  stack with known norms, stopped before the last product where the planned method allows it
  (`ns_batched.LastProduct`: the caller adds X_k to its fp32 parameters in that product's GEMM).
- `orthogonalize(x, *, coeffs, eps, use_gram, restart_iterations)`: approximate polar factor of each matrix of
  a 2-D (m, n) or 3-D (B, m, n) tensor, in x's dtype. The short side is the Gram side (tall inputs are
  transposed), each matrix is divided by its Frobenius norm (clamped at eps), the iteration runs on bf16
  operands with fp32 accumulation. On CUDA the method (cuBLAS plain, Triton symmetric, Gram-NS, CUDA-graph
  replay) is chosen per shape by `optim.kernels.plan` from measured times; on CPU it is the plain torch body.

use_gram=True allows Gram-NS (same polynomial in exact arithmetic, a slightly larger bf16 error, fewer FLOPs on
rectangular matrices); the plan still picks the plain iteration where that measures faster.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from optim.kernels.ns_batched import (
    Coeff,
    LastProduct,
    TorchOps,
    inverse_norms,
    normalize_with_norms,
    orthogonalize_with,
    plain_until_last,
)

__all__ = [
    "LastProduct",
    "available",
    "orthogonalize",
    "orthogonalize_deferred",
    "plan_for",
    "plans_in_use",
    "triton_importable",
]

if TYPE_CHECKING:
    from optim.kernels.plan import Planner

_PLANNER: Planner | None = None


@functools.cache
def triton_importable() -> bool:
    """Triton can be imported (needed by the symmetric kernels); looked up once per process."""
    return importlib.util.find_spec("triton") is not None


def available() -> bool:
    """CUDA present and Triton importable: the plan-cached GPU path can run."""
    return torch.cuda.is_available() and triton_importable()


def _planner() -> Planner:
    global _PLANNER
    if _PLANNER is None:
        from optim.kernels.plan import Planner

        _PLANNER = Planner()
    return _PLANNER


def _check(x: torch.Tensor, coeffs: Sequence[Coeff]) -> None:
    if x.ndim not in (2, 3):
        raise ValueError(f"x.ndim={x.ndim}: orthogonalize takes (m, n) or (B, m, n)")
    if not x.is_floating_point():
        raise ValueError(f"x.dtype={x.dtype}: orthogonalize takes a floating-point tensor")
    if not coeffs or any(len(t) != 3 for t in coeffs):
        raise ValueError(f"coeffs={coeffs!r}: need a non-empty list of (a, b, c)")


def orthogonalize(
    x: torch.Tensor,
    *,
    coeffs: Sequence[Coeff],
    eps: float = 1e-7,
    use_gram: bool = False,
    restart_iterations: Sequence[int] = (2,),
    dtype: torch.dtype = torch.bfloat16,
    sumsq: torch.Tensor | None = None,
) -> torch.Tensor:
    """Newton-Schulz orthogonalization of each matrix of x, one (a, b, c) per iteration.

    Args:
        x: (m, n) or (B, m, n), any float dtype, CUDA (plan-cached fast path) or CPU (plain torch body).
        coeffs: the (a, b, c) of each iteration (e.g. `optim.functional.newton_schulz.ns_coefficients`).
        eps: lower clamp of the per-matrix Frobenius norm.
        use_gram: allow Gram-NS (see module docstring).
        restart_iterations: Gram-NS iterations before which X and its Gram matrix are re-formed.
        dtype: the iterate's dtype: bf16, or fp16 (8x more accurate at the same GEMM rate; a I folded into P, see
            `optim.kernels.ns_batched`).
        sumsq: the squared Frobenius norm of each matrix of x, (B,) fp32, when the caller has it (the fused Muon
            pack computes it in its pass): the normalization then skips its norm pass. Used for a contiguous wide
            (m <= n) stack; ignored otherwise.

    Returns:
        Tensor of x's shape and dtype (possibly with transposed strides for tall matrices).
    """
    _check(x, coeffs)
    coeffs = [(float(a), float(b), float(c)) for a, b, c in coeffs]
    restarts = frozenset(int(i) for i in restart_iterations)
    xb = x.unsqueeze(0) if x.ndim == 2 else x
    xin, normalized = xb, False
    if sumsq is not None and xb.is_contiguous() and xb.size(-2) <= xb.size(-1):
        if sumsq.shape != (xb.size(0),):
            raise ValueError(
                f"sumsq.shape={tuple(sumsq.shape)}: one squared norm per matrix, ({xb.size(0)},)"
            )
        if xb.is_cuda and available() and xb.dtype == dtype:
            inside = _planner().prescaled(xb, coeffs, eps, use_gram, restarts, dtype)
            if inside is not None:  # the normalization in the first step's products, no pass of its own
                out = inside(xb, inverse_norms(sumsq, eps)).to(x.dtype)
                return out.squeeze(0) if x.ndim == 2 else out
        xin, normalized = normalize_with_norms(xb, sumsq, eps, dtype), True
    if xb.is_cuda and available():
        out = _planner().dispatch(xb, coeffs, eps, use_gram, restarts, dtype, normalized=normalized)(xin)
    else:
        out = orthogonalize_with(
            xin,
            coeffs,
            eps=eps,
            gram=use_gram,
            restarts=restarts,
            ops=TorchOps(),
            dtype=dtype,
            normalized=normalized,
        )
    out = out.to(x.dtype)  # the normalized iterate's body returns its own dtype
    return out.squeeze(0) if x.ndim == 2 else out


def orthogonalize_deferred(
    x: torch.Tensor,
    sumsq: torch.Tensor,
    *,
    coeffs: Sequence[Coeff],
    eps: float = 1e-7,
    use_gram: bool = False,
    restart_iterations: Sequence[int] = (2,),
    dtype: torch.dtype = torch.bfloat16,
) -> LastProduct | None:
    """`orthogonalize` of a contiguous wide (B, m, n) stack, m <= n, with known squared norms `sumsq` (B,), run up to
    its last product (`LastProduct`), or None (nothing run) where the method planned for x's problem does not end
    in a product that accumulates into fp32 (`plan.deferrable`; on CPU: the torch body, always deferrable). The
    caller then either finishes with `LastProduct.into` on its parameters or calls `orthogonalize`."""
    _check(x, coeffs)
    if x.ndim != 3 or not x.is_contiguous() or x.size(-2) > x.size(-1) or sumsq.shape != (x.size(0),):
        raise ValueError(
            f"orthogonalize_deferred: x {tuple(x.shape)} (contiguous={x.is_contiguous()}), sumsq "
            f"{tuple(sumsq.shape)}; need a contiguous (B, m, n) stack with m <= n and sumsq (B,)"
        )
    coeffs = [(float(a), float(b), float(c)) for a, b, c in coeffs]
    restarts = frozenset(int(i) for i in restart_iterations)
    scale = inverse_norms(sumsq, eps)
    if x.is_cuda and available():
        run = _planner().deferred(x, coeffs, eps, use_gram, restarts, dtype)
        return None if run is None else run(x, scale)
    if use_gram:
        return None
    if dtype != torch.bfloat16:  # an unnormalized stack may not fit fp16's range: normalize first
        return plain_until_last(normalize_with_norms(x, sumsq, eps, dtype), coeffs, TorchOps())
    return plain_until_last(x.to(dtype), coeffs, TorchOps(), scale)


def plan_for(
    x: torch.Tensor,
    *,
    coeffs: Sequence[Coeff],
    eps: float = 1e-7,
    use_gram: bool = False,
    restart_iterations: Sequence[int] = (2,),
    dtype: torch.dtype = torch.bfloat16,
) -> dict[str, object]:
    """The cached plan entry (method, candidate times, warm-up seconds) for x's problem; measures if missing."""
    if not (x.is_cuda and available()):
        raise ValueError(f"plan_for needs a CUDA tensor and Triton; got device={x.device}")
    xb = x.unsqueeze(0) if x.ndim == 2 else x
    coeffs = [(float(a), float(b), float(c)) for a, b, c in coeffs]
    planner = _planner()
    _, key = planner.choose(xb, coeffs, eps, use_gram, frozenset(restart_iterations), dtype)
    return dict(planner.choices[key])


def plans_in_use() -> dict[str, dict[str, object]]:
    """Plan key -> {method, times_ms, rejected, plan_s, ...} of every NS problem this process has planned (the entries
    its dispatches run, with every candidate's measured time, the seconds planning it took the process that planned
    it, the candidates of a prior); empty when nothing was orthogonalized on the GPU. For a run record: which body ran each
    shape and on which backend (`backend`: QuACK, Triton or cuBLAS), and what planning cost the first step."""
    if _PLANNER is None:
        return {}
    from optim.kernels.plan import backend_of

    keep = ("method", "times_ms", "rejected", "fallback", "prior", "plan_s")
    return {
        key: {f: entry[f] for f in keep if f in entry} | {"backend": backend_of(str(entry.get("method", "")))}
        for key, entry in _PLANNER.choices.items()
        if key in _PLANNER.complete
    }
