"""Batched Newton-Schulz bodies over a pluggable matrix-product backend.

Same math as `optim.functional.newton_schulz` (plain and Gram-NS), written once against three products so that
the cuBLAS path (`TorchOps`) and the Triton symmetric path (`optim.kernels.sym_triton.TritonOps`) share it:

    gram(X)                   = X X^T                   (symmetric by construction)
    sym(A, B, alpha, D, beta) = alpha A B^T + beta D    (caller guarantees a symmetric result BY CONSTRUCTION)
    full(A, B, alpha, D, beta) = alpha A B + beta D     (general m x m product)
    apply(P, X, beta)         = beta X + P X            (general product, m x m times m x n)

Plain step: A = gram(X); P = sym(A, A, c, A, b) (A A^T = A^2); X = apply(P, X, a).
Gram-NS step (Dao-AILab gram-newton-schulz), P = aI + Z: Z = sym(R, R, c, R, b); Q = aI + Z or full(Z, Q, 1, Q, a);
PR = full(Z, R, 1, R, a); R = sym(PR, Z, 1, PR, a) = P R P^T. Only congruences and squares of symmetric matrices
go to `sym`. Products that are symmetric only because the factors commute (Z Q, Z (R P)) stay full: in bf16 the
computed polynomials do not commute, and using one triangle of such a product raised the error 5-10x (measured:
0.10-0.19 instead of 0.017 relative to exact NS at m = 64-256; see reports/gpu_notes/ns_kernels.md).

Layout: X is (B, m, n) bf16, contiguous, m <= n (the caller transposes), already Frobenius-normalized.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

Coeff = tuple[float, float, float]


class MatOps(Protocol):
    """The three products Newton-Schulz needs; see the module docstring."""

    def gram(self, x: torch.Tensor) -> torch.Tensor: ...

    def sym(
        self, a: torch.Tensor, b: torch.Tensor, alpha: float, d: torch.Tensor | None, beta: float
    ) -> torch.Tensor: ...

    def full(
        self, a: torch.Tensor, b: torch.Tensor, alpha: float, d: torch.Tensor, beta: float
    ) -> torch.Tensor: ...

    def apply(self, p: torch.Tensor, x: torch.Tensor, beta: float) -> torch.Tensor: ...


class TorchOps:
    """cuBLAS (or CPU) products through torch.bmm / baddbmm; alpha and beta fused into the GEMM epilogue."""

    def gram(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, x.mT)

    def sym(
        self, a: torch.Tensor, b: torch.Tensor, alpha: float, d: torch.Tensor | None, beta: float
    ) -> torch.Tensor:
        if d is None:
            return torch.bmm(a, b.mT) if alpha == 1.0 else torch.bmm(a, b.mT).mul_(alpha)
        return torch.baddbmm(d, a, b.mT, beta=beta, alpha=alpha)

    def full(
        self, a: torch.Tensor, b: torch.Tensor, alpha: float, d: torch.Tensor, beta: float
    ) -> torch.Tensor:
        return torch.baddbmm(d, a, b, beta=beta, alpha=alpha)

    def apply(self, p: torch.Tensor, x: torch.Tensor, beta: float) -> torch.Tensor:
        return torch.baddbmm(x, p, x, beta=beta, alpha=1.0)


def normalize_bf16(x: torch.Tensor, eps: float, transpose: bool) -> torch.Tensor:
    """(B, r, c) any float dtype -> (B, m, n) contiguous bf16 divided by max(||x||_F, eps) per matrix.

    The norm is accumulated in fp32; the cast (and transpose) is one copy kernel and the scale one in-place
    bf16 multiply, so an fp32 input costs 4 + 6 + 4 bytes per element instead of a full fp32 intermediate; a
    contiguous bf16 input that needs no transpose is scaled in a single pass (2 + 4 bytes per element).
    """
    norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True, dtype=torch.float32)
    inv = norm.clamp_min(eps).reciprocal()
    if x.dtype == torch.bfloat16 and not transpose and x.is_contiguous():
        # One pass; the scale rounded to bf16 (relative 2^-9) only rescales the input, which NS tolerates.
        scaled: torch.Tensor = x * inv.to(torch.bfloat16)
        return scaled
    src = x.mT if transpose else x
    out = torch.empty(src.shape, dtype=torch.bfloat16, device=x.device)
    out.copy_(src)
    out.mul_(inv)
    return out


def plain_iterations(x: torch.Tensor, coeffs: Sequence[Coeff], ops: MatOps) -> torch.Tensor:
    """k plain NS steps: A = X X^T, P = b A + c A^2, X = a X + P X."""
    for a, b, c in coeffs:
        g = ops.gram(x)
        p = ops.sym(g, g, c, g, b)
        x = ops.apply(p, x, a)
    return x


def gram_iterations(
    x: torch.Tensor, coeffs: Sequence[Coeff], restarts: frozenset[int], ops: MatOps
) -> torch.Tensor:
    """Gram-NS with restarts; same recursion as `optim.functional.newton_schulz._gram_iterations`."""
    r = ops.gram(x)
    q: torch.Tensor | None = None
    last = len(coeffs) - 1
    for i, (a, b, c) in enumerate(coeffs):
        if i in restarts and q is not None:
            x = torch.bmm(q, x)
            r = ops.gram(x)
            q = None
        z = ops.sym(r, r, c, r, b)  # b R + c R^2
        if q is None:
            q = z.clone()
            q.diagonal(dim1=-2, dim2=-1).add_(a)  # a I + Z
        else:
            q = ops.full(z, q, 1.0, q, a)  # (a I + Z) Q
        if i < last and (i + 1) not in restarts:
            pr = ops.full(z, r, 1.0, r, a)  # P R
            r = ops.sym(pr, z, 1.0, pr, a)  # (P R) P^T: symmetric by construction
    assert q is not None
    return torch.bmm(q, x)


def orthogonalize_with(
    x: torch.Tensor,
    coeffs: Sequence[Coeff],
    *,
    eps: float,
    gram: bool,
    restarts: frozenset[int],
    ops: MatOps,
) -> torch.Tensor:
    """Normalize, iterate and restore layout and dtype; x is (B, r, c)."""
    transpose = x.size(-2) > x.size(-1)
    xb = normalize_bf16(x, eps, transpose)
    if gram:
        out = gram_iterations(xb, coeffs, restarts, ops)
    else:
        out = plain_iterations(xb, coeffs, ops)
    if transpose:
        out = out.mT
    return out if x.dtype == torch.bfloat16 else out.to(x.dtype)
