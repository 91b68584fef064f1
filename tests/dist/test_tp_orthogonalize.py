"""TP Newton-Schulz modes on gloo at world sizes 1, 2, 4, odd shapes so splits are uneven.

Tolerances: duplicated is bitwise equal to single-process NS (same math on the gathered matrix). Distributed and
distributed_gram sum partial Grams in another order than one GEMM: fp32 within 2e-5 (abs and rel) of the
single-process result; bf16 within 3e-2 (bf16 epsilon 7.8e-3, compounded over 5 steps).
"""

from __future__ import annotations

import warnings
from typing import Self

import pytest
import torch
import torch.distributed as dist
from dist_harness import XDIST_GROUP, context, run_suite, subgroups
from torch.testing import assert_close

from optim.distributed.comm import split_sizes
from optim.distributed.tp_orthogonalize import TPGroups, TPMode, collectives_per_matrix, tp_newton_schulz
from optim.functional.newton_schulz import newton_schulz

# (full shape, partition_dim): the long side sharded (distributed valid), batched, and the short side sharded.
CASES = [((21, 16), 0), ((16, 21), 1), ((3, 21, 16), 1), ((3, 16, 21), -1)]


def _shard(full: torch.Tensor, pdim: int, rank: int, ws: int) -> tuple[torch.Tensor, list[int]]:
    sizes = split_sizes(full.size(pdim), ws)
    return torch.tensor_split(full, ws, dim=pdim)[rank].contiguous(), sizes


def _chunk(full: torch.Tensor, pdim: int, rank: int, ws: int) -> torch.Tensor:
    return torch.tensor_split(full, ws, dim=pdim)[rank]


class _CountAllReduce:
    def __init__(self) -> None:
        self.calls = 0
        self._orig = dist.all_reduce

    def __enter__(self) -> Self:
        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.calls += 1
            return self._orig(*args, **kwargs)

        dist.all_reduce = counted
        return self

    def __exit__(self, *exc: object) -> None:
        dist.all_reduce = self._orig


def _check_modes(rank: int, ws: int, group: dist.ProcessGroup) -> None:
    gen = torch.Generator().manual_seed(7)
    for shape, pdim in CASES:
        full = torch.randn(shape, generator=gen)
        shard, sizes = _shard(full, pdim, rank, ws)
        kw = {"partition_dim": pdim, "tp_group": group, "shard_sizes": sizes}
        for dtype in (torch.float32, torch.bfloat16):
            ref = _chunk(newton_schulz(full, compute_dtype=dtype), pdim, rank, ws)
            out = tp_newton_schulz(shard, mode=TPMode.DUPLICATED, compute_dtype=dtype, **kw)
            assert_close(out, ref, rtol=0, atol=0, msg=context(f"duplicated {shape} {dtype}"))
        long_sharded = full.size(pdim) >= full.size(-1 if pdim % full.ndim == full.ndim - 2 else -2)
        for mode in (TPMode.DISTRIBUTED, TPMode.DISTRIBUTED_GRAM):
            gram = mode == TPMode.DISTRIBUTED_GRAM
            for tri in (False, True):
                for dtype, tol in ((torch.float32, 2e-5), (torch.bfloat16, 3e-2)):
                    ref = _chunk(newton_schulz(full, compute_dtype=dtype, use_gram=gram), pdim, rank, ws)
                    with warnings.catch_warnings(record=True), _CountAllReduce() as counter:
                        warnings.simplefilter("always")
                        out = tp_newton_schulz(
                            shard, mode=mode, compute_dtype=dtype, triangular_reduce=tri, **kw
                        )
                    assert_close(
                        out, ref, rtol=tol, atol=tol, msg=context(f"{mode} {shape} tri={tri} {dtype}")
                    )
                    if ws > 1 and long_sharded:
                        assert counter.calls == collectives_per_matrix(mode), (mode, counter.calls)
                    elif ws > 1:  # fell back to duplicated: an all-gather, no all-reduce
                        assert counter.calls == 0
        out = tp_newton_schulz(shard, mode=TPMode.BLOCKWISE, compute_dtype=torch.float32, **kw)
        assert_close(out, newton_schulz(shard, compute_dtype=torch.float32), rtol=0, atol=0)


def _check_expert_groups(rank: int, ws: int) -> None:
    """Expert weights use the expert-TP group: at 4 ranks dense TP = pairs, expert TP = all 4; at 2, ETP = 1."""
    if ws == 4:
        pairs, mine = subgroups(ws, 2)
        groups = TPGroups(tp=pairs[mine], expert_tp=dist.group.WORLD)
        tp_rank, tp_size, etp_rank, etp_size = rank % 2, 2, rank, 4
    else:
        groups = TPGroups(tp=dist.group.WORLD, expert_tp=None)
        tp_rank, tp_size, etp_rank, etp_size = rank, ws, 0, 1
    gen = torch.Generator().manual_seed(11)
    expert, dense = torch.randn(3, 16, 21, generator=gen), torch.randn(21, 16, generator=gen)
    e_shard, e_sizes = _shard(expert, 2, etp_rank, etp_size)
    out = tp_newton_schulz(
        e_shard,
        mode="distributed",
        partition_dim=2,
        shard_sizes=e_sizes,
        tp_group=groups.for_param(is_expert=True),
        compute_dtype=torch.float32,
    )
    assert_close(
        out,
        _chunk(newton_schulz(expert, compute_dtype=torch.float32), 2, etp_rank, etp_size),
        rtol=2e-5,
        atol=2e-5,
    )
    d_shard, d_sizes = _shard(dense, 0, tp_rank, tp_size)
    out = tp_newton_schulz(
        d_shard,
        mode="duplicated",
        partition_dim=0,
        shard_sizes=d_sizes,
        tp_group=groups.for_param(is_expert=False),
        compute_dtype=torch.float32,
    )
    assert_close(
        out, _chunk(newton_schulz(dense, compute_dtype=torch.float32), 0, tp_rank, tp_size), rtol=0, atol=0
    )


def tp_worker(rank: int, ws: int, tmp: str) -> None:
    """This module's checks on one rank (run by `dist_harness.run_suite`, one spawn per world size)."""
    _check_modes(rank, ws, dist.group.WORLD)
    _check_expert_groups(rank, ws)


@pytest.mark.dist
@pytest.mark.xdist_group(XDIST_GROUP)
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_tp_modes_match_single_process(world_size: int) -> None:
    """Localises wrong shard offsets (uneven splits), a wrong contracted dim, a missed all-reduce or extra
    collectives, a broken triangle pack, and expert weights sent over the dense TP group."""
    failure = run_suite(world_size)
    assert failure is None, failure


def test_none_group_is_single_process_and_fallback_warns() -> None:
    """tp_group=None is plain NS; sharding the short dim in distributed mode warns once and still gives NS."""
    x = torch.randn(21, 16)
    for mode in TPMode:
        assert_close(
            tp_newton_schulz(x, mode=mode, partition_dim=0, compute_dtype=torch.float32),
            newton_schulz(x, compute_dtype=torch.float32),
            rtol=0,
            atol=0,
        )
    with pytest.raises(ValueError, match="'sideways'"):
        tp_newton_schulz(x, mode="sideways", partition_dim=0)
