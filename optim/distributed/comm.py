"""Small collective helpers. Every function takes an optional process group; `None` means one process."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def group_rank_size(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(rank, size) inside `group`; (0, 1) for `None` or when torch.distributed is not initialised."""
    if group is None or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def split_sizes(total: int, num_parts: int) -> list[int]:
    """Sizes of `torch.tensor_split(range(total), num_parts)`: the first `total % num_parts` parts get one more."""
    base, extra = divmod(total, num_parts)
    return [base + (1 if i < extra else 0) for i in range(num_parts)]


def all_gatherv(
    x: torch.Tensor, sizes: Sequence[int], *, dim: int, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """Concatenate the ranks' `x` along `dim` when their sizes along `dim` differ (`sizes[r]` for rank r).

    Mechanism: pad every shard to the largest size and run one `all_gather_into_tensor`, then drop the padding.
    One collective on one contiguous buffer beats per-rank broadcasts (N launches, N latencies) and grouped
    send/recv (what NCCL does for list all_gather) as long as shards differ little in size; the padding costs at
    most (max - min) / max of the bytes, and TP shards are equal or differ by one row.
    """
    rank, size = group_rank_size(group)
    if size == 1:
        return x
    dim = dim % x.ndim
    assert len(sizes) == size and x.size(dim) == sizes[rank], (sizes, x.shape, rank)
    longest = max(sizes)
    moved = x.movedim(dim, 0)
    padded = moved.new_zeros((longest, *moved.shape[1:]))
    padded[: moved.size(0)] = moved
    out = moved.new_empty((size * longest, *moved.shape[1:]))
    dist.all_gather_into_tensor(out, padded.contiguous(), group=group)
    parts = [out[r * longest : r * longest + sizes[r]] for r in range(size)]
    return torch.cat(parts, dim=0).movedim(0, dim).contiguous()


def all_reduce_symmetric(
    g: torch.Tensor, *, group: dist.ProcessGroup | None, triangular: bool = False
) -> torch.Tensor:
    """Sum symmetric (..., m, m) matrices over `group`.

    With `triangular`, only the lower triangle travels (m (m + 1) / 2 of m^2 elements, ~half the bytes): pack with
    `tril_indices`, all-reduce, mirror back. The result is exactly symmetric either way only in the triangular
    case; the full case sums each partial as it is (GEMM Grams are symmetric in practice but not by contract).
    """
    _, size = group_rank_size(group)
    if size == 1:
        return g
    if not triangular:
        dist.all_reduce(g, group=group)
        return g
    m = g.size(-1)
    rows, cols = torch.tril_indices(m, m, device=g.device)
    packed = g[..., rows, cols].contiguous()
    dist.all_reduce(packed, group=group)
    out = torch.empty_like(g)
    out[..., rows, cols] = packed
    out[..., cols, rows] = packed
    return out
