# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernels behind `optim.kernels.fused_step` (imported lazily: needs Triton)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def momentum_pack_kernel(
    g_ptrs,
    b_ptrs,
    out_ptr,
    part_ptr,
    numel,
    beta,
    NESTEROV: tl.constexpr,
    WRITE_BUF: tl.constexpr,
    SUMSQ: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """`SUMSQ`: also the sum of squares of this block's bf16 output at part_ptr[i, pid] (one partial per program,
    summed by the caller: deterministic, no atomics)."""
    pid = tl.program_id(0)
    i = tl.program_id(1)
    g_ptr = tl.load(g_ptrs + i).to(tl.pointer_type(tl.float32))
    b_ptr = tl.load(b_ptrs + i).to(tl.pointer_type(tl.float32))
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    buf = tl.load(b_ptr + offs, mask=mask, other=0.0)
    buf = buf + (1.0 - beta) * (g - buf)
    if WRITE_BUF:
        tl.store(b_ptr + offs, buf, mask=mask)
    if NESTEROV:
        u = g + beta * (buf - g)
    else:
        u = buf
    ub = u.to(tl.bfloat16)
    tl.store(out_ptr + i.to(tl.int64) * numel + offs, ub, mask=mask)
    if SUMSQ:
        uf = ub.to(tl.float32)
        tl.store(part_ptr + i.to(tl.int64) * tl.num_programs(0) + pid, tl.sum(uf * uf, axis=0))


@triton.jit
def apply_update_kernel(p_ptrs, upd_ptr, numel, decay, step, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    i = tl.program_id(1)
    p_ptr = tl.load(p_ptrs + i).to(tl.pointer_type(tl.float32))
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    p = tl.load(p_ptr + offs, mask=mask)
    u = tl.load(upd_ptr + i.to(tl.int64) * numel + offs, mask=mask).to(tl.float32)
    tl.store(p_ptr + offs, p * decay + step * u, mask=mask)


@triton.jit
def momentum_pack_t_kernel(
    g_ptrs,
    b_ptrs,
    out_ptr,
    part_ptr,
    R,
    C,
    beta,
    NESTEROV: tl.constexpr,
    WRITE_BUF: tl.constexpr,
    SUMSQ: tl.constexpr,
    BR: tl.constexpr,
    BC: tl.constexpr,
):
    """momentum_pack_kernel for an (R, C) parameter whose NS input is stored transposed, (C, R) row-major; the
    partial sum of squares of tile (pid_r, pid_c) at part_ptr[i, pid_r * tiles_c + pid_c]."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    i = tl.program_id(2)
    g_ptr = tl.load(g_ptrs + i).to(tl.pointer_type(tl.float32))
    b_ptr = tl.load(b_ptrs + i).to(tl.pointer_type(tl.float32))
    rows = pid_r * BR + tl.arange(0, BR)
    cols = pid_c * BC + tl.arange(0, BC)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    offs = rows[:, None] * C + cols[None, :]
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    buf = tl.load(b_ptr + offs, mask=mask, other=0.0)
    buf = buf + (1.0 - beta) * (g - buf)
    if WRITE_BUF:
        tl.store(b_ptr + offs, buf, mask=mask)
    if NESTEROV:
        u = g + beta * (buf - g)
    else:
        u = buf
    ub = u.to(tl.bfloat16)
    t_offs = cols[:, None] * R + rows[None, :]
    t_mask = (cols[:, None] < C) & (rows[None, :] < R)
    tl.store(out_ptr + i.to(tl.int64) * R * C + t_offs, tl.trans(ub), mask=t_mask)
    if SUMSQ:
        uf = ub.to(tl.float32)
        tiles = tl.num_programs(0) * tl.num_programs(1)
        part = i.to(tl.int64) * tiles + pid_r * tl.num_programs(1) + pid_c
        tl.store(part_ptr + part, tl.sum(tl.sum(uf * uf, axis=1), axis=0))


@triton.jit
def apply_update_t_kernel(p_ptrs, upd_ptr, R, C, decay, step, BR: tl.constexpr, BC: tl.constexpr):
    """apply_update_kernel for an (R, C) parameter whose update is stored transposed, (C, R) row-major."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    i = tl.program_id(2)
    p_ptr = tl.load(p_ptrs + i).to(tl.pointer_type(tl.float32))
    rows = pid_r * BR + tl.arange(0, BR)
    cols = pid_c * BC + tl.arange(0, BC)
    t_offs = cols[:, None] * R + rows[None, :]
    t_mask = (cols[:, None] < C) & (rows[None, :] < R)
    u = tl.trans(tl.load(upd_ptr + i.to(tl.int64) * R * C + t_offs, mask=t_mask).to(tl.float32))
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    offs = rows[:, None] * C + cols[None, :]
    p = tl.load(p_ptr + offs, mask=mask)
    tl.store(p_ptr + offs, p * decay + step * u, mask=mask)


@triton.jit
def scale_cast_kernel(x_ptr, s_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    """out[i] = x[i] * s[i] per matrix i of a contiguous (B, numel) stack, in fp32, stored in out's dtype."""
    pid = tl.program_id(0)
    i = tl.program_id(1).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    s = tl.load(s_ptr + i)
    x = tl.load(x_ptr + i * numel + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + i * numel + offs, (x * s).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def nonfinite_kernel(x_ptrs, flag_ptr, numel, BLOCK: tl.constexpr):
    """flag[i] = 1 where tensor i (fp32, numel elements, address at x_ptrs[i]) holds a NaN or an Inf; flag is
    zeroed by the caller and only ever set, so concurrent programs need no atomics."""
    pid = tl.program_id(0)
    i = tl.program_id(1)
    x_ptr = tl.load(x_ptrs + i).to(tl.pointer_type(tl.float32))
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < numel, other=0.0)
    bad = tl.max(((x - x) != 0.0).to(tl.int32), axis=0)  # x - x is 0 for finite x, NaN for NaN and +-Inf
    tl.store(flag_ptr + i, bad, mask=bad > 0)
