"""Batched Newton-Schulz bodies over a pluggable matrix-product backend.

Same math as `optim.functional.newton_schulz` (plain and Gram-NS), written once against three products so that
the cuBLAS path (`TorchOps`) and the Triton symmetric path (`optim.kernels.sym_triton.TritonOps`) share it:

    gram(X)                   = X X^T                   (symmetric by construction)
    sym(A, B, alpha, D, beta[, diag]) = alpha A B^T + beta D (+ diag I)   (symmetric result BY CONSTRUCTION)
    full(A, B, alpha, D, beta) = alpha A B + beta D     (general m x m product)
    apply(P, X, beta)         = beta X + P X            (general product, m x m times m x n)

Plain step: A = gram(X); P = sym(A, A, c, A, b) (A A^T = A^2); X = apply(P, X, a).

Gram-NS step (Dao-AILab gram-newton-schulz), P = aI + Z: Z = sym(R, R, c, R, b); Q = aI + Z or full(Z, Q, 1, Q, a);
PR = full(Z, R, 1, R, a); R = sym(PR, Z, 1, PR, a) = P R P^T. Only congruences and squares of symmetric matrices
go to `sym`. Products that are symmetric only because the factors commute (Z Q, Z (R P)) stay full: in bf16 the
computed polynomials do not commute, and using one triangle of such a product raised the error 5-10x (measured:
0.10-0.19 instead of 0.017 relative to exact NS at m = 64-256; see docs/ns_kernels_h200.md).

Normalization in the first products (`FoldingOps.first_step`, `plain_iterations(scale=...)`): given the unnormalized
iterate G and each matrix's 1 / ||G||_F (s, known from the fused pack), the first step is computed without the
scaled copy s G: A = s^2 G G^T and P' = s (a I + b A + c A^2) in symmetric products that scale each matrix by its
own s in their epilogue, then X_1 = P' G, a plain product. That saves a pass over the stack (read and write 4 bytes
per element) and the first product's read of X; rounding a + ... to bf16 on P's diagonal costs no more accuracy than
rounding s G to bf16, which it replaces (against fp64 NS: tests/unit/test_update_fold.py).

Last product into the parameters (`plain_until_last`, `LastProduct.into`): a caller that only adds the result to
fp32 parameters, p <- beta p + alpha X_k, can stop before the last product and have it write there:
X_k = (a I + P) X with a I added on P's diagonal, so p <- beta p + alpha P' X is one GEMM accumulating into p
(`AccumulatingOps.accumulate`): 8 bytes per element (read and write p) instead of 14 (the last product's read of
X and write of X_k, then the update's reads of X_k and p and write of p). Rounding a + P_ii to the iterate's dtype
changes the update by about the size of the bf16 rounding of X_k that the fold no longer makes
(docs/ns_kernels_h200.md#kernel-design-numbers).

Layout: X is (B, m, n) bf16 (or fp16), contiguous, m <= n (the caller transposes), already Frobenius-normalized
(unless its `scale` is passed, above).

fp16 iterate (`dtype=torch.float16`, opt-in through `ns_precision="fp16"`): the normalized X has |x| <= 1, so
fp16's range suffices and its 10-bit mantissa (bf16: 7) makes the iteration ~8x more accurate at the same tensor-core
rate on Hopper. That accuracy pays for folding a I into P (P' = a I + b A + c A^2, X <- P' X with a plain bmm):
`apply` no longer copies X into the GEMM's output first (baddbmm's C = D). In bf16 the fold doubled the error
against exact NS; in fp16 it is still far below bf16's unfolded error (tests/unit/test_kernels.py; numbers:
docs/ns_kernels_h200.md#kernel-design-numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import torch

Coeff = tuple[float, float, float]


class MatOps(Protocol):
    """The three products Newton-Schulz needs; see the module docstring."""

    def gram(self, x: torch.Tensor) -> torch.Tensor: ...

    def sym(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        alpha: float,
        d: torch.Tensor | None,
        beta: float,
        diag: float = 0.0,
    ) -> torch.Tensor: ...

    def full(
        self, a: torch.Tensor, b: torch.Tensor, alpha: float, d: torch.Tensor, beta: float
    ) -> torch.Tensor: ...

    def apply(self, p: torch.Tensor, x: torch.Tensor, beta: float) -> torch.Tensor: ...


class AccumulatingOps(MatOps, Protocol):
    """MatOps that can also add a product into an fp32 tensor of any strides (the parameters, in place)."""

    def accumulate(
        self, p: torch.Tensor, x: torch.Tensor, out: torch.Tensor, alpha: float, beta: float
    ) -> None:
        """out <- beta out + alpha p x; p (B, m, m), x (B, m, n) in the iterate's dtype, out (B, m, n) fp32."""
        ...


class FoldingOps(AccumulatingOps, Protocol):
    """AccumulatingOps that can also run the first NS step on an unnormalized iterate (see the module docstring)."""

    def first_step(self, g: torch.Tensor, scale: torch.Tensor, coeff: Coeff) -> torch.Tensor:
        """X_1 of the plain iteration from X_0 = scale[i] g[i]; g (B, m, n) in the iterate's dtype, scale (B,)
        fp32."""
        ...


class TorchOps:
    """cuBLAS (or CPU) products through torch.bmm / baddbmm; alpha and beta fused into the GEMM epilogue."""

    def gram(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, x.mT)

    def sym(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        alpha: float,
        d: torch.Tensor | None,
        beta: float,
        diag: float = 0.0,
    ) -> torch.Tensor:
        if d is None:
            out = torch.bmm(a, b.mT) if alpha == 1.0 else torch.bmm(a, b.mT).mul_(alpha)
        else:
            out = torch.baddbmm(d, a, b.mT, beta=beta, alpha=alpha)
        if diag:
            out.diagonal(dim1=-2, dim2=-1).add_(diag)
        return out

    def full(
        self, a: torch.Tensor, b: torch.Tensor, alpha: float, d: torch.Tensor, beta: float
    ) -> torch.Tensor:
        return torch.baddbmm(d, a, b, beta=beta, alpha=alpha)

    def apply(self, p: torch.Tensor, x: torch.Tensor, beta: float) -> torch.Tensor:
        return torch.baddbmm(x, p, x, beta=beta, alpha=1.0)

    def accumulate(
        self, p: torch.Tensor, x: torch.Tensor, out: torch.Tensor, alpha: float, beta: float
    ) -> None:
        """The reference of `AccumulatingOps.accumulate`: the product in the iterate's dtype, added in fp32."""
        prod = torch.bmm(p, x).to(out.dtype)
        if beta != 1.0:
            out.mul_(beta)
        out.add_(prod, alpha=alpha)

    def first_step(self, g: torch.Tensor, scale: torch.Tensor, coeff: Coeff) -> torch.Tensor:
        """The reference of `FoldingOps.first_step`: products in fp32, each product rounded to g's dtype."""
        a, b, c = coeff
        s = scale.view(-1, 1, 1)
        gf = g.float()
        gram = (s * s * torch.bmm(gf, gf.mT)).to(g.dtype).float()
        p = (s * (c * torch.bmm(gram, gram) + b * gram)).to(g.dtype)
        p.diagonal(dim1=-2, dim2=-1).add_((a * scale).view(-1, 1))
        return torch.bmm(p, g)


def normalize_to(
    x: torch.Tensor, eps: float, transpose: bool, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """(B, r, c) any float dtype -> (B, m, n) contiguous `dtype` (bf16 or fp16) divided by max(||x||_F, eps) per
    matrix.

    The norm is accumulated in fp32. On CUDA a contiguous input that needs no transpose is scaled and cast in one
    Triton pass (`fused_step.scale_cast`); otherwise the cast (and transpose) is one copy kernel and the scale one
    in-place multiply (fp16: one fp32 multiply into the fp16 output), never a full fp32 intermediate.
    """
    norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True, dtype=torch.float32)
    inv = norm.clamp_min(eps).reciprocal()
    if x.is_cuda and not transpose and x.is_contiguous():
        # one Triton pass, product in fp32 (torch's broadcast multiply measured at < half the bandwidth)
        from optim.kernels.fused_step import scale_cast

        return scale_cast(x, inv, dtype)
    if x.dtype == dtype and not transpose and x.is_contiguous():
        # One pass; the scale rounded to the iterate's dtype only rescales the input, which NS tolerates.
        scaled: torch.Tensor = x * inv.to(dtype)
        return scaled
    src = x.mT if transpose else x
    out = torch.empty(src.shape, dtype=dtype, device=x.device)
    if dtype == torch.float16:
        # scale in fp32 and cast in one pass: an unnormalized input can exceed fp16's range (65504)
        torch.mul(src, inv, out=out)
        return out
    out.copy_(src)
    out.mul_(inv)
    return out


def inverse_norms(sumsq: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / max(||x_i||_F, eps) from the squared norms: each matrix's normalization scale."""
    return sumsq.sqrt().clamp_min(eps).reciprocal()


def normalize_with_norms(
    x: torch.Tensor, sumsq: torch.Tensor, eps: float, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """`normalize_to` of a contiguous (B, m, n) stack, m <= n, whose squared Frobenius norms (B,) fp32 are known
    (`optim.kernels.fused_step.momentum_pack_with_norms`): one scale-and-cast pass, no norm pass."""
    from optim.kernels.fused_step import scale_cast  # Triton on CUDA, its torch reference elsewhere

    return scale_cast(x, inverse_norms(sumsq, eps), dtype)


def plain_iterations(
    x: torch.Tensor,
    coeffs: Sequence[Coeff],
    ops: MatOps,
    *,
    fold: bool = False,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """k plain NS steps: A = X X^T, P = b A + c A^2, X = a X + P X (`fold`: X = (a I + P) X, no copy of X).
    `scale` (B,) fp32: x is the unnormalized iterate and matrix i is normalized by scale[i] inside the first step
    (`FoldingOps.first_step`; ops must provide it)."""
    if scale is not None and coeffs:
        x = cast(FoldingOps, ops).first_step(x, scale, coeffs[0])
        coeffs = coeffs[1:]
    for a, b, c in coeffs:
        g = ops.gram(x)
        if fold:
            x = torch.bmm(ops.sym(g, g, c, g, b, diag=a), x)  # (a I + b A + c A^2) X
        else:
            x = ops.apply(ops.sym(g, g, c, g, b), x, a)
    return x


@dataclass(frozen=True, slots=True)
class LastProduct:
    """A plain NS call stopped before its last product: X_k = p x, with p = a I + b A + c A^2 (B, m, m) and x the
    iterate (B, m, n), both in the iterate's dtype. `into` adds it to fp32 tensors instead of materializing X_k."""

    p: torch.Tensor
    x: torch.Tensor
    ops: AccumulatingOps

    def into(self, out: torch.Tensor, *, alpha: float, beta: float, start: int = 0) -> None:
        """out <- beta out + alpha X_k[start : start + len(out)]; out (n, m, n_cols) fp32, any strides (e.g. a
        run of parameters viewed as one stack, transposed for tall ones)."""
        stop = start + out.size(0)
        if (
            out.dtype != torch.float32
            or out.shape[1:] != self.x.shape[1:]
            or not 0 <= start < stop <= len(self.x)
        ):
            raise ValueError(
                f"into: out {tuple(out.shape)} {out.dtype} at start={start}; need fp32 (n, "
                f"{self.x.size(1)}, {self.x.size(2)}) within the batch of {len(self.x)}"
            )
        self.ops.accumulate(self.p[start:stop], self.x[start:stop], out, alpha, beta)

    def result(self, start: int = 0) -> torch.Tensor:
        """X_k[start:] itself, in the iterate's dtype (the way back to an ordinary update)."""
        return torch.bmm(self.p[start:], self.x[start:])


def plain_until_last(
    x: torch.Tensor, coeffs: Sequence[Coeff], ops: AccumulatingOps, scale: torch.Tensor | None = None
) -> LastProduct:
    """The plain iteration of `plain_iterations` on the normalized iterate x (or the unnormalized one with its
    `scale`, see `plain_iterations`), stopped before its last product (see `LastProduct`); the earlier steps as
    `plain_iterations` runs them for x's dtype."""
    if scale is not None and len(coeffs) == 1:  # the first step is the last: normalize in a pass of its own
        from optim.kernels.fused_step import scale_cast

        x, scale = scale_cast(x, scale, x.dtype), None
    x = plain_iterations(x, coeffs[:-1], ops, fold=x.dtype == torch.float16, scale=scale)
    a, b, c = coeffs[-1]
    g = ops.gram(x)
    return LastProduct(ops.sym(g, g, c, g, b, diag=a), x, ops)


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
    dtype: torch.dtype = torch.bfloat16,
    normalized: bool = False,
) -> torch.Tensor:
    """Normalize, iterate in `dtype` (bf16, or fp16 with a I folded into P) and restore layout and dtype; x is
    (B, r, c). `normalized`: x is already the iterate (B, m, n), m <= n, contiguous, in `dtype`, each matrix
    divided by its Frobenius norm (`normalize_with_norms`): the normalization pass is skipped."""
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"dtype={dtype}: the batched NS iterates in torch.bfloat16 or torch.float16")
    if normalized:
        if x.dtype != dtype or x.size(-2) > x.size(-1):
            raise ValueError(
                f"normalized=True needs the iterate: dtype {dtype} with rows <= cols; got {x.dtype}, "
                f"{tuple(x.shape)}"
            )
        transpose, xb = False, x
    else:
        transpose = x.size(-2) > x.size(-1)
        xb = normalize_to(x, eps, transpose, dtype)
    if gram:
        out = gram_iterations(xb, coeffs, restarts, ops)
    else:
        out = plain_iterations(xb, coeffs, ops, fold=dtype == torch.float16)
    if transpose:
        out = out.mT
    return out if x.dtype == out.dtype else out.to(x.dtype)
