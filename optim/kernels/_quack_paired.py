# mypy: ignore-errors
"""QuACK's SM90 symmetric GEMM on the paired triangular schedule (`optim.kernels.paired_schedule`; imported lazily:
needs quack-kernels 0.6.5 and its CuTe DSL): 128 x 128 pingpong tiles in 2 x 1 clusters whose two CTAs take any two
tiles of one tile column, sharing (multicasting) that column's panel.

QuACK's own triangular scheduler (`quack.tile_scheduler.TriangularTileScheduler`) gives each cluster one square
output tile: in 128 x 256 tiles with 2 x 1 clusters, 256 x 256 squares (on a 1536-row Gram 21 squares of 36, 84
tile-equivalents of 128 x 128 where 78 hold the triangle); in 128 x 128 tiles without clusters, the 78 tiles but no
multicast (each CTA loads both panels of its tile from L2). The paired schedule computes the 78 tiles with the
column panel multicast. Everything else is QuACK's kernel: the per-matrix scaled epilogue of
`optim.kernels._quack_scaled` (D = u A B^T + v C with (L, m) row scales) and the mirrored store, whose diagonal test
is per tile here (QuACK's compares cluster squares).

How the pair reaches each CTA: the scheduler warp of CTA 0 computes cluster w's (c, r0, r1) and writes one record to
both CTAs' shared memory, adding each CTA's rank in the cluster to the row field (QuACK's code); the row field carries
r0 in its low and r1 in its high 16 bits, and each CTA takes its own half when it reads the record. A CTA's first tile
is computed by the CTA itself (its rank picks r0 or r1).
"""

# No `from __future__ import annotations`: the CuTe DSL reads annotations at runtime.
from dataclasses import dataclass
from typing import Optional

import cutlass
import cutlass.cute as cute  # noqa: PLR0402
import torch
from cutlass import Boolean, Float32, Int32, const_expr
from quack.epilogue.ops import TileStore
from quack.fast_math import FastDivmod
from quack.tile_scheduler import (
    PersistenceMode,
    TileSchedulerArguments,
    TriangularTileScheduler,
    WorkTileInfo,
)

from optim.kernels._quack_scaled import GemmSymmetricRowScaledSm90, scaled_symmetric

TILE = 128
CLUSTER_M = 2


class PairedTriangularTileScheduler(TriangularTileScheduler):
    """Static persistent schedule over ceil(n (n + 1) / 4) clusters per matrix, n = ceil(m / 128)
    (`paired_schedule.pair`)."""

    @dataclass
    class Params:
        problem_shape_ncluster_mnl: cute.Shape
        num_clusters_per_problem_fdd: FastDivmod
        ntile: Int32
        tile_count_semaphore: Optional[cute.Pointer]  # noqa: UP045 - as QuACK declares it
        cluster_shape_mnk: cutlass.Constexpr[cute.Shape]
        persistence_mode: cutlass.Constexpr[PersistenceMode]
        num_split_k: cutlass.Constexpr[int] = 1

        @staticmethod
        @cute.jit
        def create(
            args: TileSchedulerArguments, *, loc=None, ip=None
        ) -> "PairedTriangularTileScheduler.Params":
            assert args.cluster_shape_mnk[0] == CLUSTER_M and args.cluster_shape_mnk[1] == 1
            assert args.cluster_shape_mnk[2] == 1 and args.num_split_k == 1
            assert args.persistence_mode == PersistenceMode.STATIC, "the paired schedule is static persistent"
            n = args.problem_shape_ntile_mnl[0]
            leftover = (n + 1) // 2
            num_pairs = n * n // 4 + (leftover + 1) // 2
            return PairedTriangularTileScheduler.Params(
                (num_pairs, 1, args.problem_shape_ntile_mnl[2]),
                FastDivmod(num_pairs),
                n,
                None,
                args.cluster_shape_mnk,
                args.persistence_mode,
            )

    @staticmethod
    def to_underlying_arguments(args: TileSchedulerArguments, *, loc=None, ip=None):
        return PairedTriangularTileScheduler.Params.create(args, loc=loc, ip=ip)

    @cute.jit
    def _pair(self, w: Int32):
        """(c, r0, r1) of cluster w of one matrix: `paired_schedule.pair`."""
        n = self.params.ntile
        regular = n * n // 4
        c, r0, r1 = Int32(0), Int32(0), Int32(0)
        if w < regular:
            rest = regular - w
            k = Int32(cute.math.ceil(2.0 * cute.math.sqrt(Float32(rest))))
            if k * k // 4 < rest:
                k = k + 1
            if (k - 1) * (k - 1) // 4 >= rest:
                k = k - 1
            c = n - k
            r0 = c + 2 * (w - (regular - k * k // 4))
            r1 = r0 + 1
        else:
            c = n - 1
            r0 = n - 1 - 4 * (w - regular)
            r1 = r0 - 2
            if r1 < 0:
                r1 = r0
        return c, r0, r1

    @cute.jit
    def _delinearize_work_idx(
        self,
        work_idx: Int32,
        bidz: Optional[Int32] = None,  # noqa: UP045 - QuACK's signature
        is_valid: Optional[Boolean] = None,  # noqa: UP045
        *,
        block_zero_only: bool = False,
        loc=None,
        ip=None,
    ) -> WorkTileInfo:
        params = self.params
        if const_expr(is_valid is None):
            is_valid = (
                work_idx < params.num_clusters_per_problem_fdd.divisor * params.problem_shape_ncluster_mnl[2]
            )
        pid_m, pid_n, batch_idx = Int32(0), Int32(0), Int32(0)
        if is_valid:
            batch_idx, w = divmod(work_idx, params.num_clusters_per_problem_fdd)
            c, r0, r1 = self._pair(Int32(w))
            pid_n = c
            if const_expr(block_zero_only):
                pid_m = r0 + (r1 << 16)  # the record for both CTAs; see get_current_work
            else:
                pid_m = r0
                if cute.arch.block_in_cluster_idx()[0] == 1:
                    pid_m = r1
        return WorkTileInfo((pid_m, pid_n, None, batch_idx), is_valid)

    @cute.jit
    def get_current_work(self, *, loc=None, ip=None) -> WorkTileInfo:
        work = TriangularTileScheduler.get_current_work(self, loc=loc, ip=ip)
        raw = work.tile_idx[0]
        # CTA 0 reads r0 + (r1 << 16); CTA 1 the same plus 1 (its rank, added by the writer): its row is r1
        pid_m = raw & 0xFFFF
        if cute.arch.block_in_cluster_idx()[0] == 1:
            pid_m = raw >> 16
        return WorkTileInfo((pid_m, work.tile_idx[1], work.tile_idx[2], work.tile_idx[3]), work.is_valid_tile)

    @staticmethod
    def get_grid_shape(params, max_active_clusters: Int32, *, loc=None, ip=None):
        clusters = params.num_clusters_per_problem_fdd.divisor * params.problem_shape_ncluster_mnl[2]
        persistent = cutlass.min(clusters, max_active_clusters)
        return (CLUSTER_M, 1, persistent)


def _offdiag_tile(gemm, tile_coord_mnkl):
    """The mirrored store skips diagonal tiles (their mirror is themselves)."""
    return tile_coord_mnkl[0] != tile_coord_mnkl[1]


class GemmSymmetricRowScaledPairedSm90(GemmSymmetricRowScaledSm90):
    """`GemmSymmetricRowScaledSm90` on the paired triangular schedule."""

    _epi_ops = tuple(
        TileStore("mAuxOut", store_pred_fn=_offdiag_tile)
        if isinstance(op, TileStore) and op.name == "mAuxOut"
        else op
        for op in GemmSymmetricRowScaledSm90._epi_ops
    )

    def get_scheduler_class(self, varlen_m: bool = False):
        return PairedTriangularTileScheduler


def paired_symmetric(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    scale_ab: torch.Tensor,
    c: torch.Tensor | None = None,
    scale_c: torch.Tensor | None = None,
) -> None:
    """out[l] = scale_ab[l] a[l] b[l]^T + scale_c[l] c[l] for a symmetric result, on the paired schedule; the
    arguments of `optim.kernels._quack_scaled.scaled_symmetric`. SM90 only."""
    paired = GemmSymmetricRowScaledPairedSm90
    scaled_symmetric(a, b, out, scale_ab, c, scale_c, TILE, TILE, CLUSTER_M, True, gemm_cls=paired)
