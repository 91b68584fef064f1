# mypy: ignore-errors
"""QuACK's symmetric GEMM with a per-matrix scale in its epilogue (imported lazily: needs quack-kernels 0.6.5 and
its CuTe DSL; see `optim.kernels.sym_quack.scaled_symmetric`).

    D[l] = u[l] * A[l] B[l]^T + v[l] * C[l]     for a batch l = 0..L-1 of symmetric products

QuACK's symmetric GEMM (`quack.gemm_symmetric`) scales by one alpha and one beta per call. This subclass of its SM90
kernel keeps everything of it (triangular tile schedule, mirrored stores) and replaces the linear epilogue: u and v
arrive as (L, m) fp32 column vectors (QuACK's `ColVecLoad` operand, one value per output row), every row of batch l
holding u[l] (resp. v[l]), so each output element is scaled by its matrix's scalar and the result stays symmetric.
The Newton-Schulz entry uses it to fold each matrix's Frobenius normalization into its first products.
"""

# No `from __future__ import annotations`: the CuTe DSL reads the EpilogueArguments annotations (Constexpr) at
# runtime, as QuACK's own modules leave them.
from pathlib import Path
from typing import NamedTuple, Optional

import cutlass
import cutlass.cute as cute  # noqa: PLR0402 - the CuTe DSL's own spelling
import quack.cache
import torch
from cutlass import Float32, Int32, const_expr
from quack.cache import jit_cache
from quack.compile_utils import make_fake_tensor
from quack.cute_dsl_utils import (
    get_device_capacity,
    get_max_active_clusters,
    mlir_namedtuple,
)
from quack.epilogue.ops import ColVecLoad
from quack.gemm_symmetric import GemmSymmetricSm90
from quack.gemm_tvm_ffi_utils import (
    compile_gemm_kernel,
    div_for_dtype,
    fake_batched,
    get_dtypes,
    get_major,
    get_majors,
    launch_gemm,
    make_fake_gemm_tensors,
    make_fake_scheduler_args,
    make_scheduler_args,
    tensor_key,
)
from quack.rounding import RoundingMode

# QuACK keys its persistent compiled-kernel cache on its own sources; these kernels are ours: their directory joins
# the key, so a changed kernel here is compiled again instead of loaded from a stale cache entry.
_SOURCES = Path(__file__).resolve().parent
if _SOURCES not in quack.cache.EXTRA_SOURCE_DIRS:
    quack.cache.EXTRA_SOURCE_DIRS.append(_SOURCES)


class GemmSymmetricRowScaledSm90(GemmSymmetricSm90):
    """D = rowscale_ab * (A B^T) + rowscale_c * C with (L, m) fp32 row scales, mirrored like QuACK's symmetric GEMM."""

    _epi_ops = GemmSymmetricSm90._epi_ops + (ColVecLoad("mRowScaleC"),)

    @mlir_namedtuple
    class EpilogueArguments(NamedTuple):
        mAuxOut: cute.Tensor
        mColVecBroadcast: cute.Tensor  # (L, m) scale of A B^T
        mRowScaleC: Optional[cute.Tensor] = None  # noqa: UP045 - (L, m) scale of C; runtime-read annotation
        rounding_mode: cutlass.Constexpr[int] = RoundingMode.RN
        sr_seed: Optional[Int32 | cute.Tensor] = None  # noqa: UP045 - as QuACK declares it

    @cute.jit
    def epi_visit_subtile(self, params, epi_loop_tensors, tRS_rD, tRS_rC=None):
        u = epi_loop_tensors.get("mColVecBroadcast")
        for i in cutlass.range(cute.size(tRS_rD), unroll_full=True):
            tRS_rD[i] = tRS_rD[i] * u[i]
        if const_expr(tRS_rC is not None):
            v = epi_loop_tensors.get("mRowScaleC")
            for i in cutlass.range(cute.size(tRS_rD), unroll_full=True):
                tRS_rD[i] = tRS_rD[i] + v[i] * tRS_rC[i].to(Float32)
        return (tRS_rD,)


@jit_cache
def _compile(
    gemm_cls,
    a_dtype,
    d_dtype,
    c_dtype,
    a_major,
    d_major,
    c_major,
    postact_major,
    tile_mn,
    cluster_m,
    pingpong,
):
    mA, mB, mD, mC, m, _n, _k, l = make_fake_gemm_tensors(
        a_dtype, a_dtype, d_dtype, c_dtype, a_major, a_major, d_major, c_major, batched=True
    )
    mAuxOut = fake_batched(d_dtype, m, m, l, 1 if postact_major == "n" else 0, div_for_dtype(d_dtype))
    scale_ab = make_fake_tensor(Float32, (l, m), leading_dim=1, divisibility=4)
    scale_c = (
        make_fake_tensor(Float32, (l, m), leading_dim=1, divisibility=4) if c_dtype is not None else None
    )
    epi_args = gemm_cls.EpilogueArguments(mAuxOut, scale_ab, scale_c)
    return compile_gemm_kernel(
        gemm_cls,
        a_dtype,
        tile_mn,
        (cluster_m, 1, 1),
        pingpong,
        True,  # persistent
        False,
        False,  # static scheduler
        (9, 0),
        mA,
        mB,
        mD,
        mC,
        epi_args,
        make_fake_scheduler_args(False, False, l),
        None,
    )


class _Plan(NamedTuple):
    compiled_fn: object
    scheduler: object


_PLANS: dict[tuple, _Plan] = {}


def scaled_symmetric(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    scale_ab: torch.Tensor,
    c: torch.Tensor | None = None,
    scale_c: torch.Tensor | None = None,
    tile_m: int = 128,
    tile_n: int = 128,
    cluster_m: int = 1,
    pingpong: bool = True,
    *,
    gemm_cls: type = GemmSymmetricRowScaledSm90,
) -> None:
    """out[l] = scale_ab[l] a[l] b[l]^T + scale_c[l] c[l] (see the module docstring); a, b (L, m, k), out and c
    (L, m, m), scale_ab and scale_c (L, m) fp32 contiguous, rows of one batch equal. SM90 only. `gemm_cls`: this
    kernel or a subclass with another tile schedule (`optim.kernels._quack_paired`)."""
    if (c is None) != (scale_c is None):
        raise ValueError("scaled_symmetric: c and scale_c go together")
    if get_device_capacity(a.device)[0] != 9:
        raise ValueError("scaled_symmetric: SM90 only (QuACK's SM90 symmetric kernel)")
    key = (
        tensor_key(a),
        tensor_key(out),
        tensor_key(c),
        a.device,
        tile_m,
        tile_n,
        cluster_m,
        pingpong,
        gemm_cls,
    )
    plan = _PLANS.get(key)
    if plan is None:
        a_major, _, d_major, c_major = get_majors(a, b, out, c)
        a_dtype, _, d_dtype, c_dtype = get_dtypes(a, b, out, c)
        fn = _compile(
            gemm_cls,
            a_dtype,
            d_dtype,
            c_dtype,
            a_major,
            d_major,
            c_major,
            get_major(out.mT, "m", "n"),
            (tile_m, tile_n),
            cluster_m,
            pingpong,
        )
        clusters = get_max_active_clusters(cluster_m, device_capacity=(9, 0))
        plan = _PLANS[key] = _Plan(fn, make_scheduler_args(clusters, 8, None))
    epi = gemm_cls.EpilogueArguments(out.mT, scale_ab, scale_c, rounding_mode=None, sr_seed=None)
    launch_gemm(plan, a, b, out, c, epi, plan.scheduler, None)
