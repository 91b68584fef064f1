"""Newton-Schulz (NS) on tensor-parallel shards: duplicated, distributed (plain or Gram-NS) and blockwise.

A TP-sharded weight of full shape (R, C) lives as shards along `partition_dim` (0: rows, 1: columns of the last two
dims). Modes (`TPMode`):

- `DUPLICATED`: all-gather the shards, full NS on every TP rank, keep the own chunk. One collective per matrix,
  ~(tp - 1) / tp * R * C elements received; compute x tp. Equal to single-process NS bit for bit.
- `DISTRIBUTED`: NS on the shards. The sharded dim must be the long one, so that it is the contracted dim of the
  short-side Gram X X^T; then the Gram is the sum of the shards' partial Grams: one scalar all-reduce for the norm
  and one m x m all-reduce per step (k per matrix). A^2 and B X are local (A^2 redundantly on every rank). If the
  short dim is sharded the Gram would be the long side's, so this falls back to `DUPLICATED` with a one-time warning.
- `DISTRIBUTED_GRAM`: the Gram-NS form of the same. X_k = Q_k X_0 with Q_k a polynomial in R_0 = X_0 X_0^T, so only
  R_0 (once) and the re-formed Gram at each restart need an all-reduce: 1 + len(restarts) collectives instead of k.
  The Frobenius norm comes from trace(R_0), so it needs no extra scalar all-reduce.
- `BLOCKWISE`: each shard orthogonalised alone, no communication. The result depends on the TP size (it is the
  polar factor of each block, not of the matrix); at TP = 1 it equals the other modes.

`triangular_reduce` all-reduces only the lower triangle of each symmetric Gram (~half the bytes).
`tp_group=None` (or a group of one) is single-process NS, so every mode is its own reference.

Numerical notes: the distributed modes normalise by the all-reduced sum of squares without the overflow-safe
power-of-two pre-scaling of `newton_schulz` (fine for gradients and momenta in fp32 range), and their Gram sums
run in a different order than one GEMM, so they match single-process NS to rounding, not bitwise.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from optim.configs import TPMode
from optim.distributed.comm import all_gatherv, all_reduce_symmetric, group_rank_size
from optim.functional.newton_schulz import Coeff, newton_schulz, ns_coefficients


@dataclass(frozen=True, kw_only=True, slots=True)
class TPGroups:
    """The TP groups of one rank: dense weights use `tp`, expert weights the expert-TP group `expert_tp`."""

    tp: dist.ProcessGroup | None = None
    expert_tp: dist.ProcessGroup | None = None

    def for_param(self, *, is_expert: bool) -> dist.ProcessGroup | None:
        """The group a weight is sharded over (MCore: names with "experts", not "shared_experts", are expert)."""
        return self.expert_tp if is_expert else self.tp


_WARNED: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key in _WARNED:
        return
    _WARNED.add(key)
    if not dist.is_initialized() or dist.get_rank() == 0:
        warnings.warn(message, stacklevel=3)


def tp_newton_schulz(
    x: torch.Tensor,
    *,
    mode: TPMode | str,
    partition_dim: int | None,
    tp_group: dist.ProcessGroup | None = None,
    shard_sizes: Sequence[int] | None = None,
    num_ns_steps: int = 5,
    coefficients: str | Sequence[Sequence[float]] = "quintic",
    compute_dtype: torch.dtype = torch.bfloat16,
    eps: float = 1e-7,
    use_gram: bool = False,
    restart_iterations: Sequence[int] = (2,),
    triangular_reduce: bool = False,
) -> torch.Tensor:
    """Orthogonalise this rank's shard of a TP-sharded matrix; returns the shard of the result.

    Args:
        x: local shard, (m_local, n) / (m, n_local) or batched (B, ., .).
        mode: see `TPMode`.
        partition_dim: dim of `x` that is sharded (-2 / -1 or the positive index); None = not sharded.
        tp_group: the TP group (the expert-TP group for expert weights, see `TPGroups`); None = one process.
        shard_sizes: size of every rank's shard along `partition_dim` (uneven splits); None = all equal.
        num_ns_steps, coefficients, compute_dtype, eps, use_gram, restart_iterations: as `newton_schulz`
            (`use_gram` applies to DUPLICATED and BLOCKWISE; DISTRIBUTED_GRAM always iterates on the Gram).
        triangular_reduce: all-reduce only the lower triangle of the Grams (distributed modes).

    Returns:
        Tensor of the shape and dtype of `x`.
    """
    mode = TPMode(mode)
    rank, size = group_rank_size(tp_group)
    ns_kwargs = {
        "num_ns_steps": num_ns_steps,
        "coefficients": coefficients,
        "compute_dtype": compute_dtype,
        "eps": eps,
        "use_gram": use_gram,
        "restart_iterations": restart_iterations,
    }
    if partition_dim is None or size == 1 or mode == TPMode.BLOCKWISE:
        return newton_schulz(x, **ns_kwargs)  # type: ignore[arg-type]
    pdim = partition_dim % x.ndim
    if pdim < x.ndim - 2:
        raise ValueError(
            f"partition_dim={partition_dim}: must be one of the last two dims of x.shape={tuple(x.shape)}"
        )
    sizes = list(shard_sizes) if shard_sizes is not None else [x.size(pdim)] * size
    if len(sizes) != size:
        raise ValueError(f"shard_sizes={sizes}: needs one entry per rank of the TP group (size {size})")
    full = list(x.shape)
    full[pdim] = sum(sizes)
    sharded_is_long = full[pdim] >= full[x.ndim - 1 if pdim == x.ndim - 2 else x.ndim - 2]
    if mode in (TPMode.DISTRIBUTED, TPMode.DISTRIBUTED_GRAM) and not sharded_is_long:
        _warn_once(
            f"{mode}:{full}",
            f"tp_mode={mode.value!r}: the short dim of a {full[-2]}x{full[-1]} matrix is "
            "sharded, so its Gram would be the long side's; falling back to 'duplicated' for such matrices",
        )
        mode = TPMode.DUPLICATED
    if mode == TPMode.DUPLICATED:
        whole = all_gatherv(x, sizes, dim=pdim, group=tp_group)
        out = newton_schulz(whole, **ns_kwargs)  # type: ignore[arg-type]
        start = sum(sizes[:rank])
        return out.narrow(pdim, start, sizes[rank]).contiguous()
    coeffs = (
        ns_coefficients(coefficients, num_ns_steps)
        if isinstance(coefficients, str)
        else ns_coefficients("custom", num_ns_steps, custom=coefficients)
    )
    xb = x.unsqueeze(0) if x.ndim == 2 else x
    transpose = pdim == x.ndim - 2  # make the sharded (long) dim the last, contracted one
    if transpose:
        xb = xb.mT
    norm_dtype = torch.float64 if compute_dtype == torch.float64 else torch.float32
    xb = xb.to(norm_dtype)
    if mode == TPMode.DISTRIBUTED:
        out = _distributed_plain(xb, coeffs, compute_dtype, eps, tp_group, triangular_reduce)
    else:
        out = _distributed_gram(
            xb, coeffs, compute_dtype, eps, frozenset(restart_iterations), tp_group, triangular_reduce
        )
    if transpose:
        out = out.mT
    out = out.to(x.dtype)
    return out.squeeze(0) if x.ndim == 2 else out.contiguous()


def _distributed_plain(
    x: torch.Tensor,
    coeffs: Sequence[Coeff],
    compute_dtype: torch.dtype,
    eps: float,
    group: dist.ProcessGroup | None,
    triangular: bool,
) -> torch.Tensor:
    """x: (B, m, n_local) in the norm dtype; one scalar-per-matrix all-reduce, then one Gram all-reduce per step."""
    sq = (x * x).sum(dim=(-2, -1))
    dist.all_reduce(sq, group=group)
    xc = (x / sq.sqrt().clamp_min(eps)[:, None, None]).to(compute_dtype)
    for a, b, c in coeffs:
        gram = all_reduce_symmetric(xc @ xc.mT, group=group, triangular=triangular)
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        xc = torch.baddbmm(xc, poly, xc, beta=a, alpha=1.0)
    return xc


def _distributed_gram(
    x: torch.Tensor,
    coeffs: Sequence[Coeff],
    compute_dtype: torch.dtype,
    eps: float,
    restarts: frozenset[int],
    group: dist.ProcessGroup | None,
    triangular: bool,
) -> torch.Tensor:
    """Gram-NS on shards: R_0 all-reduced once (norm dtype; its trace gives the norm), one more per restart."""
    r0 = all_reduce_symmetric(x @ x.mT, group=group, triangular=triangular)
    norm = r0.diagonal(dim1=-2, dim2=-1).sum(-1).clamp_min(0).sqrt().clamp_min(eps)[:, None, None]
    xc = (x / norm).to(compute_dtype)
    r = (r0 / (norm * norm)).to(compute_dtype)
    q: torch.Tensor | None = None
    last = len(coeffs) - 1
    for i, (a, b, c) in enumerate(coeffs):
        if i in restarts and q is not None:
            xc = q @ xc
            r = all_reduce_symmetric(xc @ xc.mT, group=group, triangular=triangular)
            q = None
        z = torch.baddbmm(r, r, r, beta=b, alpha=c)
        if q is None:
            q = z.clone()
            q.diagonal(dim1=-2, dim2=-1).add_(a)
        else:
            q = torch.baddbmm(q, z, q, beta=a, alpha=1.0)
        if i < last:
            rz = torch.baddbmm(r, r, z, beta=a, alpha=1.0)
            r = torch.baddbmm(rz, z, rz, beta=a, alpha=1.0)
    assert q is not None
    return q @ xc


def collectives_per_matrix(mode: TPMode | str, *, num_ns_steps: int = 5, num_restarts: int = 1) -> int:
    """Collectives one sharded matrix costs per NS call (for reports and tests)."""
    match TPMode(mode):
        case TPMode.DUPLICATED:
            return 1
        case TPMode.DISTRIBUTED:
            return 1 + num_ns_steps
        case TPMode.DISTRIBUTED_GRAM:
            return 1 + num_restarts
        case TPMode.BLOCKWISE:
            return 0
