# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernel for products with a symmetric output: C = alpha * A B^T + beta * D, one triangle computed.

Used for X X^T (B = A = X), A A^T = A^2 for symmetric A, and the congruence (P R) P^T of Gram-NS: products whose
output is symmetric by construction (not merely because the factors commute; see `optim.kernels.ns_batched`). Only lower-triangle tiles (tile row >= tile column) are launched; each stores its tile and, off the
diagonal, the transposed tile, so about half the multiply-adds of the full product are done.

bf16 operands, fp32 accumulation (tl.dot), epilogue alpha/beta in fp32, bf16 output. Batched over a leading
dimension through the second grid axis. Rows are read modulo M (no masks on M in the inner loop); K is masked only
when it is not a multiple of BLOCK_K. Configs are fixed; the plan in `optim.kernels.plan` times
them against cuBLAS per shape instead of autotuning.

Two kernels share that contract:
- `_sym_mm_kernel`: pointer loads, square BLOCK x BLOCK tiles (configs t128, t128s4, t128w4, t64).
- `_sym_mm_tma_kernel`: operand tiles through Hopper's tensor-memory accelerator (host-side tensor descriptors
  over the (B*M, K) view; Triton pipelines the bulk copies), and rectangular BLOCK_M x BLOCK_N tiles: the lower
  triangle is walked in square BLOCK_N super-tiles, each computed by BLOCK_N / BLOCK_M programs of BLOCK_M rows.
  A diagonal super-tile is computed whole (both halves of its rows), an off-diagonal one is stored and mirrored.
  Rows past M in a tile read the next matrix of the batch (or TMA's zero fill past the end); their outputs are
  masked. Needs a contiguous input whose row pitch (K elements) is a multiple of 16 bytes; otherwise `sym_mm`
  takes the pointer kernel. Configs tma128, tma128s5, tma128w4, tma128k128, tma256 (128 x 256 tiles, the usual
  Hopper GEMM shape); tma128o, tma128w4o also read D and store C and its mirror through descriptors when M is a
  multiple of the tile (the transposed tile goes out through shared memory by the bulk-copy engine), tma128wso
  with Triton's warp specialization of the K loop on top. tma128g8, tma256g4: the same kernel with a grouped
  launch order (below).
- `_sym_mm_persistent_kernel`: the TMA kernel's tile body in a persistent loop, one program per SM walking the
  tiles of every matrix of the batch with a fixed stride; Triton flattens the tile and K loops into one
  pipelined loop, so the next tile's operand loads are in flight during this tile's epilogue (the epilogue, with
  D read and two stores, is a large share of a tile when K is short: b A + c A^2 has K = m). Configs ptma128,
  ptma256, ptma128o (a 128 x 256 persistent tile with a TMA store needs 278 KB of shared memory at 3 stages,
  more than the H200's 227 KB: not offered).

Launch order: row-major over the lower triangle, or with `group` in bands of that many tile rows, each band's
rectangle left of its diagonal block column by column and then its own triangle. Concurrent programs then share
`group` row panels and a few column panels in L2 instead of one row panel and as many column panels as programs
(a single large matrix, e.g. 8192 x 8192: its panels do not fit L2 together).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from optim.kernels._sym_triton_tiles import _epilogue_masked, _lower_tile, _store_tile, _tile_dot, _tile_of
from optim.kernels.tiles import TILE_SPECS


@triton.jit
def _sym_mm_kernel(
    a_ptr, b_ptr, d_ptr, c_ptr,
    M, K,
    s_ab, s_am, s_ak,
    s_bb, s_bm, s_bk,
    s_db, s_dm, s_dn,
    s_cb, s_cm, s_cn,
    alpha, beta, diag,
    HAS_D: tl.constexpr,
    HAS_DIAG: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    bid = tl.program_id(1).to(tl.int64)
    tm, tn = _lower_tile(tl.program_id(0))

    rows = tm * BLOCK + tl.arange(0, BLOCK)
    cols = tn * BLOCK + tl.arange(0, BLOCK)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + bid * s_ab + (rows % M)[:, None] * s_am + offs_k[None, :] * s_ak
    b_ptrs = b_ptr + bid * s_bb + (cols % M)[:, None] * s_bm + offs_k[None, :] * s_bk
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k in range(tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            kmask = (k * BLOCK_K + offs_k) < K
            a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=kmask[None, :], other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk

    _epilogue_masked(
        acc * alpha, rows, cols, M, bid, d_ptr, c_ptr,
        s_db, s_dm, s_dn, s_cb, s_cm, s_cn,
        beta, diag, tm != tn, HAS_D, HAS_DIAG,
    )  # fmt: skip


@triton.jit
def _sym_mm_tma_kernel(
    a_desc, b_desc, d_desc, c_desc, ct_desc, d_ptr, c_ptr,
    M, K,
    s_db, s_dm, s_dn,
    s_cb, s_cm, s_cn,
    alpha, beta, diag,
    HAS_D: tl.constexpr,
    HAS_DIAG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TMA_OUT: tl.constexpr,
    WS: tl.constexpr,
    GROUP: tl.constexpr,
):  # fmt: skip
    SPLIT: tl.constexpr = BLOCK_N // BLOCK_M
    pid = tl.program_id(0)
    bid = tl.program_id(1)
    tm, tn = _tile_of(pid // SPLIT, tl.cdiv(M, BLOCK_N), GROUP)
    row0 = tm * BLOCK_N + (pid % SPLIT) * BLOCK_M
    col0 = tn * BLOCK_N
    acc = _tile_dot(a_desc, b_desc, bid * M + row0, bid * M + col0, K, BLOCK_M, BLOCK_N, BLOCK_K, WS)
    _store_tile(
        acc, tm, tn, row0, col0, bid, M, tl.num_programs(1), d_desc, c_desc, ct_desc, d_ptr, c_ptr,
        s_db, s_dm, s_dn, s_cb, s_cm, s_cn, alpha, beta, diag,
        HAS_D, HAS_DIAG, BLOCK_M, BLOCK_N, TMA_OUT,
    )  # fmt: skip


@triton.jit
def _sym_mm_persistent_kernel(
    a_desc, b_desc, d_desc, c_desc, ct_desc, d_ptr, c_ptr,
    M, K, NB, NUM_PROGS,
    s_db, s_dm, s_dn,
    s_cb, s_cm, s_cn,
    alpha, beta, diag,
    HAS_D: tl.constexpr,
    HAS_DIAG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TMA_OUT: tl.constexpr,
    GROUP: tl.constexpr,
):  # fmt: skip
    """`_sym_mm_tma_kernel`'s tiles, matrix after matrix, program p taking tiles p, p + NUM_PROGS, ..."""
    SPLIT: tl.constexpr = BLOCK_N // BLOCK_M
    nt = tl.cdiv(M, BLOCK_N)
    per_matrix = nt * (nt + 1) // 2 * SPLIT
    for tile in tl.range(tl.program_id(0), per_matrix * NB, NUM_PROGS, flatten=True):
        bid = tile // per_matrix
        pid = tile % per_matrix
        tm, tn = _tile_of(pid // SPLIT, nt, GROUP)
        row0 = tm * BLOCK_N + (pid % SPLIT) * BLOCK_M
        col0 = tn * BLOCK_N
        acc = _tile_dot(a_desc, b_desc, bid * M + row0, bid * M + col0, K, BLOCK_M, BLOCK_N, BLOCK_K, False)
        _store_tile(
            acc, tm, tn, row0, col0, bid, M, NB, d_desc, c_desc, ct_desc, d_ptr, c_ptr,
            s_db, s_dm, s_dn, s_cb, s_cm, s_cn, alpha, beta, diag,
            HAS_D, HAS_DIAG, BLOCK_M, BLOCK_N, TMA_OUT,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class TileConfig:
    """One fixed launch config of the symmetric kernel."""

    block: int
    """Output tile rows (BLOCK_M); with `block_n` unset also its columns."""
    block_k: int
    num_warps: int
    num_stages: int
    block_n: int = 0
    """Output tile columns (BLOCK_N, a multiple of `block`; 0 = square). Only with `tma`."""
    tma: bool = False
    """Load operand tiles through tensor descriptors (`_sym_mm_tma_kernel`)."""
    tma_out: bool = False
    """Also read D and store C (and its mirror) through tensor descriptors when M is a multiple of the tile
    (otherwise the masked pointer epilogue). Only with `tma`."""
    warp_specialize: bool = False
    """Ask Triton to warp-specialize the K loop (producer / consumer partitions). Only with `tma`; a config the
    compiler cannot build is rejected by the plan like any failing candidate."""
    group: int = 0
    """Tile rows per band of the grouped launch order (module docstring); 0 = row-major. Only with `tma`."""
    persistent: bool = False
    """One program per SM looping over the tiles (`_sym_mm_persistent_kernel`). Only with `tma`, not with
    `warp_specialize`."""
    programs: int = 0
    """Programs of a persistent launch; 0 = the device's SM count."""

    def __post_init__(self) -> None:
        if (self.tma_out or self.warp_specialize or self.group or self.persistent) and not self.tma:
            raise ValueError(
                "TileConfig.tma_out / warp_specialize / group / persistent need tma=True (tensor-descriptor "
                "operand loads)"
            )
        if self.persistent and self.warp_specialize:
            raise ValueError("TileConfig.persistent=True with warp_specialize=True: not supported together")
        if self.group < 0 or self.programs < 0:
            raise ValueError(
                f"TileConfig.group={self.group}, programs={self.programs}: need >= 0 (0 = row-major / SM count)"
            )
        if self.block_n and (not self.tma or self.block_n % self.block):
            raise ValueError(
                f"TileConfig.block_n={self.block_n}: rectangular tiles need tma=True and block_n a multiple of "
                f"block={self.block}"
            )


TILE_CONFIGS: dict[str, TileConfig] = {name: TileConfig(**fields) for name, fields in TILE_SPECS.items()}
"""The tile configs of `optim/kernels/sym_tiles.json`, by name (read once: `optim.kernels.tiles`)."""
# Pointer-kernel config used when a TMA config meets an input the descriptors cannot address.
_TMA_FALLBACK = "t128"


@functools.cache
def _num_sms(device: torch.device) -> int:
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def _tma_ok(t: torch.Tensor) -> bool:
    return t.is_contiguous() and t.data_ptr() % 16 == 0 and (t.size(-1) * t.element_size()) % 16 == 0


def sym_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    alpha: float = 1.0,
    d: torch.Tensor | None = None,
    beta: float = 0.0,
    diag: float = 0.0,
    config: TileConfig = TILE_CONFIGS["t128"],
) -> torch.Tensor:
    """alpha * a @ b^T + beta * d + diag * I for (B, M, K) bf16 (or fp16) a, b whose product is known symmetric;
    returns (B, M, M).

    d (B, M, M) must be symmetric (only the lower-triangle tiles of it are read). `diag` is added in the epilogue
    (the a I of a folded NS step) before the rounding to the output dtype.
    """
    assert a.ndim == 3 and a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape)
    nb, m, k = a.shape
    c = torch.empty((nb, m, m), dtype=a.dtype, device=a.device)
    dd = c if d is None else d
    if config.tma:
        if _tma_ok(a) and _tma_ok(b):
            return _launch_tma(a, b, dd, c, d is not None, float(alpha), float(beta), float(diag), config)
        config = TILE_CONFIGS[_TMA_FALLBACK]
    nt = triton.cdiv(m, config.block)
    grid = (nt * (nt + 1) // 2, nb)
    _sym_mm_kernel[grid](
        a, b, dd, c,
        m, k,
        a.stride(0), a.stride(1), a.stride(2),
        b.stride(0), b.stride(1), b.stride(2),
        dd.stride(0), dd.stride(1), dd.stride(2),
        c.stride(0), c.stride(1), c.stride(2),
        float(alpha), float(beta), float(diag),
        HAS_D=d is not None,
        HAS_DIAG=diag != 0.0,
        EVEN_K=k % config.block_k == 0,
        BLOCK=config.block,
        BLOCK_K=config.block_k,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )  # fmt: skip
    return c


def _launch_tma(
    a: torch.Tensor,
    b: torch.Tensor,
    dd: torch.Tensor,
    c: torch.Tensor,
    has_d: bool,
    alpha: float,
    beta: float,
    diag: float,
    config: TileConfig,
) -> torch.Tensor:
    from triton.tools.tensor_descriptor import TensorDescriptor

    nb, m, k = a.shape
    bm, bn = config.block, config.block_n or config.block
    a_desc = TensorDescriptor.from_tensor(a.view(nb * m, k), [bm, config.block_k])
    b_desc = TensorDescriptor.from_tensor(b.view(nb * m, k), [bn, config.block_k])
    tma_out = config.tma_out and m % bn == 0 and dd.is_contiguous() and _tma_ok(dd)
    if tma_out:
        c2, d2 = c.view(nb * m, m), dd.view(nb * m, m)
        d_desc = TensorDescriptor.from_tensor(d2, [bm, bn])
        c_desc = TensorDescriptor.from_tensor(c2, [bm, bn])
        ct_desc = c_desc if bm == bn else TensorDescriptor.from_tensor(c2, [bn, bm])
    else:  # unused by the kernel (TMA_OUT=False); any valid descriptors
        d_desc = c_desc = ct_desc = a_desc
    nt = triton.cdiv(m, bn)
    tiles = nt * (nt + 1) // 2 * (bn // bm)
    if config.persistent:
        progs = min(tiles * nb, config.programs or _num_sms(a.device))
        _sym_mm_persistent_kernel[(progs,)](
            a_desc, b_desc, d_desc, c_desc, ct_desc, dd, c,
            m, k, nb, progs,
            dd.stride(0), dd.stride(1), dd.stride(2),
            c.stride(0), c.stride(1), c.stride(2),
            alpha, beta, diag,
            HAS_D=has_d,
            HAS_DIAG=diag != 0.0,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=config.block_k,
            TMA_OUT=tma_out,
            GROUP=config.group,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )  # fmt: skip
        return c
    _sym_mm_tma_kernel[(tiles, nb)](
        a_desc, b_desc, d_desc, c_desc, ct_desc, dd, c,
        m, k,
        dd.stride(0), dd.stride(1), dd.stride(2),
        c.stride(0), c.stride(1), c.stride(2),
        alpha, beta, diag,
        HAS_D=has_d,
        HAS_DIAG=diag != 0.0,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=config.block_k,
        TMA_OUT=tma_out,
        WS=config.warp_specialize,
        GROUP=config.group,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )  # fmt: skip
    return c


class TritonOps:
    """`MatOps` with the symmetric products in Triton and the general product X <- beta X + P X in cuBLAS."""

    def __init__(self, config: TileConfig) -> None:
        self.config = config

    def gram(self, x: torch.Tensor) -> torch.Tensor:
        return sym_mm(x, x, config=self.config)

    def sym(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        alpha: float,
        d: torch.Tensor | None,
        beta: float,
        diag: float = 0.0,
    ) -> torch.Tensor:
        return sym_mm(a, b, alpha=alpha, d=d, beta=beta, diag=diag, config=self.config)

    def full(
        self, a: torch.Tensor, b: torch.Tensor, alpha: float, d: torch.Tensor, beta: float
    ) -> torch.Tensor:
        return torch.baddbmm(d, a, b, beta=beta, alpha=alpha)

    def apply(self, p: torch.Tensor, x: torch.Tensor, beta: float) -> torch.Tensor:
        return torch.baddbmm(x, p, x, beta=beta, alpha=1.0)
