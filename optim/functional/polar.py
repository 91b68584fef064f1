"""Exact polar factor via SVD: X = U S V^T -> (U V^T, S).

U V^T is the orthogonal matrix nearest to X in every unitarily invariant norm; sum(S) is the nuclear norm
(PolarGrad, arXiv:2505.21799, scales the MOP update by it). For rank-deficient X the factor is not unique: SVD
picks some basis for the null space, so U V^T has singular values 1 there, whereas Newton-Schulz leaves them 0.

Numerical caveats: `torch.linalg.svd` runs in the input dtype (bf16 is upcast to fp32); use `polar_reference` in
tests, which computes in fp64.
"""

from __future__ import annotations

import torch


def polar_svd(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Polar factor and singular values of each matrix.

    Args:
        x: (m, n) or (B, m, n).

    Returns:
        (U V^T with the shape and dtype of x, singular values (..., min(m, n)) in the compute dtype).
    """
    if x.ndim not in (2, 3):
        raise ValueError(f"x.ndim={x.ndim}: polar_svd takes (m, n) or (B, m, n)")
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    u, s, vh = torch.linalg.svd(work, full_matrices=False)
    return (u @ vh).to(x.dtype), s


def polar_reference(x: torch.Tensor) -> torch.Tensor:
    """fp64 polar factor U V^T, returned in fp64 (test reference)."""
    u, _, vh = torch.linalg.svd(x.to(torch.float64), full_matrices=False)
    out: torch.Tensor = u @ vh
    return out
