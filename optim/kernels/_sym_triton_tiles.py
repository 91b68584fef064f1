# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Tile helpers of the Triton symmetric kernels (`optim.kernels.sym_triton`): launch order over the lower triangle,
the TMA main loop, and the epilogues (alpha acc + beta D + diag I, stored and mirrored)."""

import triton
import triton.language as tl


@triton.jit
def _lower_tile(idx):
    """Linear index -> lower-triangle tile (tm, tn), tn <= tm, row-major; fixes the float rounding of the sqrt."""
    tm = ((tl.sqrt((8 * idx + 1).to(tl.float32)) - 1.0) * 0.5).to(tl.int32)
    tm = tl.where(tm * (tm + 1) // 2 > idx, tm - 1, tm)
    tm = tl.where((tm + 1) * (tm + 2) // 2 <= idx, tm + 1, tm)
    return tm, idx - tm * (tm + 1) // 2


@triton.jit
def _tile_of(idx, NT, GROUP: tl.constexpr):
    """Linear index -> lower-triangle tile (tm, tn) of an NT x NT tile grid: row-major (GROUP = 0) or in bands of
    GROUP tile rows (module docstring). A band holds whole rows, so it starts at its first row's row-major index."""
    tm, tn = _lower_tile(idx)
    if GROUP > 0:
        g0 = (tm // GROUP) * GROUP
        rows = tl.minimum(NT - g0, GROUP)
        local = idx - g0 * (g0 + 1) // 2
        rect = rows * g0  # tiles of the band left of its diagonal block
        tri_m, tri_n = _lower_tile(tl.maximum(local - rect, 0))
        tm = tl.where(local < rect, g0 + local % rows, g0 + tri_m)
        tn = tl.where(local < rect, local // rows, g0 + tri_n)
    return tm, tn


@triton.jit
def _epilogue_masked(
    acc, rows, cols, M, bid64, d_ptr, c_ptr,
    s_db, s_dm, s_dn,
    s_cb, s_cm, s_cn,
    beta, diag, mirror,
    HAS_D: tl.constexpr,
    HAS_DIAG: tl.constexpr,
):  # fmt: skip
    """acc (already times alpha) + beta D + diag I, stored at (rows, cols) of matrix bid64 and, with `mirror`,
    transposed at (cols, rows); pointer loads and stores masked to the M x M matrix (`mirror` is part of the mask,
    not a branch: a loop holding this epilogue can still be flattened)."""
    cmask = (rows[:, None] < M) & (cols[None, :] < M)
    if HAS_D:
        d = tl.load(d_ptr + bid64 * s_db + rows[:, None] * s_dm + cols[None, :] * s_dn, mask=cmask, other=0.0)
        acc += beta * d.to(tl.float32)
    if HAS_DIAG:
        acc = tl.where(rows[:, None] == cols[None, :], acc + diag, acc)
    out = acc.to(c_ptr.dtype.element_ty)
    c_base = c_ptr + bid64 * s_cb
    tl.store(c_base + rows[:, None] * s_cm + cols[None, :] * s_cn, out, mask=cmask)
    tmask = (cols[:, None] < M) & (rows[None, :] < M) & mirror
    tl.store(c_base + cols[:, None] * s_cm + rows[None, :] * s_cn, tl.trans(out), mask=tmask)


@triton.jit
def _tile_dot(a_desc, b_desc, row0, col0, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, WS: tl.constexpr):  # fmt: skip
    """fp32 (BLOCK_M, BLOCK_N) tile of A B^T at rows row0, columns col0 of the (B*M, K) views, loads through TMA."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(tl.cdiv(K, BLOCK_K), warp_specialize=WS):
        a = a_desc.load([row0, k * BLOCK_K])
        b = b_desc.load([col0, k * BLOCK_K])
        acc = tl.dot(a, b.T, acc)
    return acc


@triton.jit
def _store_tile(
    acc, tm, tn, row0, col0, bid, M, NB,
    d_desc, c_desc, ct_desc, d_ptr, c_ptr,
    s_db, s_dm, s_dn,
    s_cb, s_cm, s_cn,
    alpha, beta, diag,
    HAS_D: tl.constexpr,
    HAS_DIAG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TMA_OUT: tl.constexpr,
):  # fmt: skip
    """Epilogue of a TMA-kernel tile at (row0, col0) of matrix bid of NB: alpha acc + beta D + diag I, stored and,
    off the diagonal, mirrored. Branch-free, so that the persistent kernel's loop can be flattened: a diagonal
    tile's mirror goes to row NB * M of the (NB*M, M) view, past its end, where a TMA store writes nothing."""
    acc = acc * alpha
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = col0 + tl.arange(0, BLOCK_N)
    if TMA_OUT:  # M % BLOCK_N == 0: every tile lies inside its matrix, so the (B*M, M) view needs no masks
        base = bid * M
        if HAS_D:
            acc += beta * d_desc.load([base + row0, col0]).to(tl.float32)
        if HAS_DIAG:
            acc = tl.where(rows[:, None] == cols[None, :], acc + diag, acc)
        out = acc.to(c_desc.dtype)
        c_desc.store([base + row0, col0], out)
        ct_desc.store([tl.where(tm != tn, base + col0, NB * M), row0], tl.trans(out))
    else:
        _epilogue_masked(
            acc, rows, cols, M, bid.to(tl.int64), d_ptr, c_ptr,
            s_db, s_dm, s_dn, s_cb, s_cm, s_cn,
            beta, diag, tm != tn, HAS_D, HAS_DIAG,
        )  # fmt: skip
