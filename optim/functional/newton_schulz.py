"""Newton-Schulz orthogonalization: X -> approx. U V^T for X = U S V^T.

One step on the short-side-first iterate X (m x n, m <= n) with coefficients (a, b, c):

    A = X X^T,   B = b A + c A^2,   X <- a X + B X

which maps every singular value s to p(s) = a s + b s^3 + c s^5. Starting from X / ||X||_F (all s in (0, 1]),
the tuned coefficient sets push the singular values into a band around 1 in a few steps. Several do not converge
to exactly 1, by design (Keller Jordan's Muon notes): in fp64, from a Gaussian 64 x 128 matrix, "quintic" ends
its 5 steps in [0.978, 1.032] (and in [0.978, 1.061] from a matrix of condition number 100); the band of every set
at every step count is pinned by tests/unit/test_ns.py.

Steps beyond a set's length repeat its last tuple: each set's last polynomial has a stable fixed point near 1
(a converged tuple), whereas starting the set over would pull the singular values far from 1 again.

Gram-NS (Dao-AILab gram-newton-schulz): since X_k = Q_k X_0 with Q_k a polynomial in R_0 = X_0 X_0^T, iterate on
the m x m symmetric matrices only:

    Z = b R + c R^2,   Q <- (a I + Z) Q,   R <- (a I + Z) R (a I + Z)

and apply X = Q X_0 at the end. A restart (before the listed iterations) forms X = Q X_0, re-forms R = X X^T and
resets Q = I, which bounds the error growth of the Gram recursion in low precision. Cost with k = 5 and one
restart: ~6 m^2 n + 14 m^3 with symmetric kernels instead of k (4 m^2 n + 2 m^3).

References: Jordan, "Muon" (2024); You/leloykun quintic coefficients; Amsel et al., "Polar Express",
arXiv:2505.16932; Grishina et al., "CANS", arXiv:2506.10935; thib-s/flash-newton-schulz (AOL);
DeepSeek-V4 report; Dao-AILab/gram-newton-schulz.

Gram-NS squares the condition number of the iterate, so in bf16 it loses singular values below ~1/16 of the
largest; with "quintic", "polar_express" and "simple" and one restart at iteration 2 it stays within ~2% of
fp32 NS (tests), but "cans" (intermediate singular values reach ~2) diverges in bf16 with that restart
(measured relative error 11 vs 0.1 for plain NS): use plain NS or fp32 there.

Numerical caveats: the Frobenius normalization uses a power-of-two pre-scaling (exact), so inputs whose squares
would under- or overflow in fp32 are still normalized correctly; an all-zero input returns zeros; ||X|| < eps
gives X / eps, as in the reference implementations. Non-finite inputs give non-finite outputs (callers check).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, islice, repeat

import torch

Coeff = tuple[float, float, float]

COEFFICIENT_SETS: dict[str, tuple[Coeff, ...]] = {
    "simple": ((3.4445, -4.7750, 2.0315),),
    "quintic": (
        (4.0848, -6.8946, 2.9270),
        (3.9505, -6.3029, 2.6377),
        (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046),
        (2.8366, -3.0525, 1.2012),
    ),
    # Polar Express with the 1.01^degree safety factor folded in.
    "polar_express": (
        (8.2051, -22.9019, 16.4607),
        (4.0664, -2.8612, 0.5184),
        (3.9096, -2.8234, 0.5250),
        (3.2856, -2.4153, 0.4853),
        (2.2779, -1.6198, 0.3985),
        (1.8726, -1.2307, 0.3585),
        (1.8564, -1.2132, 0.3568),
        (1.8750, -1.2500, 0.3750),
    ),
    "cans": (
        (8.4703, -25.1081, 18.6293),
        (4.1828, -3.1087, 0.5806),
        (3.9619, -2.9541, 0.5630),
        (3.2866, -2.4647, 0.5074),
        (2.2737, -1.6447, 0.4162),
    ),
    "aol": (
        (4.0098, -7.0585, 2.4635),
        (3.4585, -5.5479, 2.5959),
        (2.7573, -3.2939, 1.4254),
        (2.7215, -3.0494, 1.3169),
    ),
    "deepseekv4": ((3.4445, -4.7750, 2.0315),) * 8 + ((2.0, -1.5, 0.5),) * 2,
}
COEFFICIENT_NAMES = (*COEFFICIENT_SETS, "custom")


def ns_coefficients(
    name: str, num_ns_steps: int, custom: Sequence[Sequence[float]] | None = None
) -> list[Coeff]:
    """Returns the (a, b, c) tuple of each of `num_ns_steps` iterations.

    Args:
        name: one of `COEFFICIENT_NAMES`.
        num_ns_steps: number of iterations, >= 1; steps beyond the set's length repeat its last tuple.
        custom: the user list for `name="custom"`; must be None otherwise.

    Raises:
        ValueError: unknown name, num_ns_steps < 1, a custom list missing, empty or not made of triples.
    """
    if name not in COEFFICIENT_NAMES:
        raise ValueError(f"coefficients={name!r} is not one of {COEFFICIENT_NAMES}")
    if num_ns_steps < 1:
        raise ValueError(f"num_ns_steps={num_ns_steps} must be >= 1")
    if name == "custom":
        if not custom or any(len(t) != 3 for t in custom):
            raise ValueError(f"custom={custom!r}: coefficients='custom' needs a non-empty list of (a, b, c)")
        base: Sequence[Coeff] = [(float(a), float(b), float(c)) for a, b, c in custom]
    elif custom is not None:
        raise ValueError(f"custom={custom!r} given with coefficients={name!r}; use coefficients='custom'")
    else:
        base = COEFFICIENT_SETS[name]
    return list(islice(chain(base, repeat(base[-1])), num_ns_steps))


def _normalize_fro(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / max(||x||_F, eps) per matrix of a (B, m, n) fp32 tensor, robust to under/overflow.

    Scaling by 2^-e (e the exponent of max|x|) is exact, so in the normal range the result equals the plain
    formula bit for bit; the scale is applied in two halves so that 2^|e| itself never overflows.
    """
    amax = x.abs().amax(dim=(-2, -1), keepdim=True)
    _, exp = torch.frexp(amax)
    k1 = torch.div(-exp, 2, rounding_mode="floor").to(x.dtype)
    k2 = (-exp).to(x.dtype) - k1
    y = torch.ldexp(torch.ldexp(x, k1), k2)
    thresh = torch.ldexp(torch.ldexp(torch.full_like(amax, eps), k1), k2)
    out: torch.Tensor = y / y.norm(dim=(-2, -1), keepdim=True).clamp_min(thresh)
    return out


def _plain_iterations(x: torch.Tensor, coeffs: Sequence[Coeff]) -> torch.Tensor:
    for a, b, c in coeffs:
        gram = x @ x.mT
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, poly, x, beta=a, alpha=1.0)
    return x


def _gram_iterations(x: torch.Tensor, coeffs: Sequence[Coeff], restarts: frozenset[int]) -> torch.Tensor:
    r = x @ x.mT  # (B, m, m), symmetric
    q: torch.Tensor | None = None
    last = len(coeffs) - 1
    for i, (a, b, c) in enumerate(coeffs):
        if i in restarts and q is not None:
            x = q @ x
            r = x @ x.mT
            q = None
        z = torch.baddbmm(r, r, r, beta=b, alpha=c)  # b R + c R^2
        if q is None:
            q = z.clone()
            q.diagonal(dim1=-2, dim2=-1).add_(a)  # a I + Z
        else:
            q = torch.baddbmm(q, z, q, beta=a, alpha=1.0)  # (a I + Z) Q
        if i < last:
            rz = torch.baddbmm(r, r, z, beta=a, alpha=1.0)  # R (a I + Z)
            r = torch.baddbmm(rz, z, rz, beta=a, alpha=1.0)  # (a I + Z) R (a I + Z)
    assert q is not None
    return q @ x


def newton_schulz(
    x: torch.Tensor,
    *,
    num_ns_steps: int = 5,
    coefficients: str | Sequence[Sequence[float]] = "quintic",
    compute_dtype: torch.dtype = torch.bfloat16,
    eps: float = 1e-7,
    use_gram: bool = False,
    restart_iterations: Sequence[int] = (2,),
) -> torch.Tensor:
    """Approximate polar factor of each matrix of `x` by Newton-Schulz iterations.

    Args:
        x: (m, n) or (B, m, n); any float dtype. Batched matrices are independent.
        num_ns_steps: iterations.
        coefficients: a set name (see `COEFFICIENT_NAMES`) or an explicit list of (a, b, c) (its last tuple
            repeated when num_ns_steps exceeds its length).
        compute_dtype: dtype of the iterate and of the GEMMs (bf16 = MCore "medium"; fp32 = "highest").
            Normalization is always done in fp32 (or fp64 when compute_dtype is fp64).
        eps: lower clamp of the Frobenius norm.
        use_gram: iterate on the m x m Gram matrix (Gram-NS) instead of on X.
        restart_iterations: Gram-NS only: iterations before which X and its Gram are re-formed.

    Returns:
        Tensor of the shape and dtype of `x`.
    """
    if x.ndim not in (2, 3):
        raise ValueError(f"x.ndim={x.ndim}: newton_schulz takes (m, n) or (B, m, n)")
    if compute_dtype not in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        raise ValueError(f"compute_dtype={compute_dtype} is not one of bfloat16, float16, float32, float64")
    if isinstance(coefficients, str):
        coeffs = ns_coefficients(coefficients, num_ns_steps)
    else:
        coeffs = ns_coefficients("custom", num_ns_steps, custom=coefficients)
    norm_dtype = torch.float64 if compute_dtype == torch.float64 else torch.float32
    in_dtype, was_2d = x.dtype, x.ndim == 2
    xb = x.unsqueeze(0) if was_2d else x
    transpose = xb.size(-2) > xb.size(-1)
    if transpose:
        xb = xb.mT
    xb = _normalize_fro(xb.to(norm_dtype), eps).to(compute_dtype)
    if use_gram:
        out = _gram_iterations(xb, coeffs, frozenset(restart_iterations))
    else:
        out = _plain_iterations(xb, coeffs)
    if transpose:
        out = out.mT
    out = out.to(in_dtype)
    return out.squeeze(0) if was_2d else out.contiguous()
