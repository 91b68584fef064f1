"""SOAP / KL-Shampoo building blocks on batched (B, m, n) gradients.

SOAP (arXiv 2409.11321): Kronecker factors L ~ E[G G^T] (m x m), R ~ E[G^T G] (n x n); eigenbases Q_L, Q_R;
Adam runs on the rotated gradient Q_L^T G Q_R and its update is rotated back, Q_L U Q_R^T.
KL-Shampoo (arXiv 2509.03378) replaces the factor statistics by

    L <- beta L + (1 - beta) / n * G Q_R diag(lam_R)^-1 Q_R^T G^T
    R <- beta R + (1 - beta) / m * G^T Q_L diag(lam_L)^-1 Q_L^T G

with lam = diag(Q^T F Q) of the previous basis clamped at eps. A side whose Q is None is unpreconditioned
(identity basis); its missing lam is taken as 1 in the other side's KL update.

Numerical caveats: eigh runs in the factor dtype (fp32) and falls back to fp64 when LAPACK/cuSOLVER fails;
eigenvectors come back with eigenvalues in descending order, as in emerging-optimizers.
"""

from __future__ import annotations

import torch

Basis = torch.Tensor | None


def rotate(x: torch.Tensor, q_l: Basis, q_r: Basis) -> torch.Tensor:
    """Q_L^T x Q_R (into the eigenbasis); x: (B, m, n)."""
    if q_l is not None:
        x = q_l.mT @ x
    if q_r is not None:
        x = x @ q_r
    return x


def rotate_back(x: torch.Tensor, q_l: Basis, q_r: Basis) -> torch.Tensor:
    """Q_L x Q_R^T (back to the parameter basis)."""
    if q_l is not None:
        x = q_l @ x
    if q_r is not None:
        x = x @ q_r.mT
    return x


def approx_eigvals(factor: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """diag(Q^T F Q): (B, k, k) x (B, k, k) -> (B, k)."""
    return (basis * (factor @ basis)).sum(dim=-2)


def factor_updates(g: torch.Tensor, has_l: bool, has_r: bool) -> tuple[Basis, Basis]:
    """Plain Shampoo statistics (G G^T, G^T G) for the sides that are preconditioned."""
    return (g @ g.mT if has_l else None), (g.mT @ g if has_r else None)


def kl_factor_updates(
    g: torch.Tensor, l: Basis, r: Basis, q_l: Basis, q_r: Basis, eps: float
) -> tuple[Basis, Basis]:
    """KL-Shampoo statistics from the current factors and the previous bases (formula in the module doc)."""
    m, n = g.shape[-2:]
    upd_l = upd_r = None
    # Same association as emerging-optimizers (C = Q diag(1/(k lam)) Q^T, then G^T C G): the KL statistics of a
    # rank-deficient factor depend on eigh's arbitrary null-space basis, so rounding-level agreement matters.
    if r is not None:
        assert q_r is not None
        inv = approx_eigvals(r, q_r).clamp_min(eps).reciprocal() / n
        upd_l = (g @ ((q_r * inv.unsqueeze(-2)) @ q_r.mT)) @ g.mT
    elif l is not None:
        upd_l = g @ g.mT / n
    if l is not None:
        assert q_l is not None
        inv = approx_eigvals(l, q_l).clamp_min(eps).reciprocal() / m
        upd_r = (g.mT @ ((q_l * inv.unsqueeze(-2)) @ q_l.mT)) @ g
    elif r is not None:
        upd_r = g.mT @ g / m
    return upd_l, upd_r


def eigh_descending(factor: torch.Tensor) -> torch.Tensor:
    """Eigenvectors of symmetric (B, k, k), columns by descending eigenvalue; fp64 retry on failure."""
    try:
        _, vecs = torch.linalg.eigh(factor)
    except RuntimeError:  # torch.linalg.LinAlgError is a RuntimeError
        _, vecs = torch.linalg.eigh(factor.double())
        vecs = vecs.to(factor.dtype)
    out: torch.Tensor = vecs.flip(-1)
    return out


def sort_basis(factor: torch.Tensor, basis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns of `basis` by descending diag(Q^T F Q); returns (sorted basis, permutation (B, k))."""
    idx = torch.argsort(approx_eigvals(factor, basis), dim=-1, descending=True)
    return basis.gather(-1, idx.unsqueeze(-2).expand_as(basis)), idx


def qr_power_step(factor: torch.Tensor, basis: torch.Tensor, steps: int) -> torch.Tensor:
    """Orthogonal iteration: `steps` rounds of Q <- qr(F Q).Q."""
    for _ in range(steps):
        basis = torch.linalg.qr(factor @ basis).Q
    return basis


def adam_direction(
    g: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    betas: tuple[float, float],
    eps: float,
    step: int,
    correct_bias: bool,
    nesterov: bool,
) -> torch.Tensor:
    """Adam direction m_hat / (sqrt(v_hat) + eps); updates exp_avg, exp_avg_sq in place. step is 1-based."""
    b1, b2 = betas
    exp_avg.lerp_(g, 1 - b1)
    exp_avg_sq.lerp_(g.square(), 1 - b2)
    bc1 = 1 - b1**step if correct_bias else 1.0
    bc2 = 1 - b2**step if correct_bias else 1.0
    if nesterov:
        bcn = 1 - b1 ** (step + 1) if correct_bias else 1.0
        mom = b1 * exp_avg / bcn + (1 - b1) * g / bc1
    else:
        mom = exp_avg / bc1
    return mom / ((exp_avg_sq / bc2).sqrt() + eps)
