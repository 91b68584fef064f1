# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernels behind `optim.kernels.fused_step` (imported lazily: needs Triton)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def momentum_pack_kernel(g_ptrs, b_ptrs, out_ptr, numel, beta, NESTEROV: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    i = tl.program_id(1)
    g_ptr = tl.load(g_ptrs + i).to(tl.pointer_type(tl.float32))
    b_ptr = tl.load(b_ptrs + i).to(tl.pointer_type(tl.float32))
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    g = tl.load(g_ptr + offs, mask=mask)
    buf = tl.load(b_ptr + offs, mask=mask)
    buf = buf + (1.0 - beta) * (g - buf)
    tl.store(b_ptr + offs, buf, mask=mask)
    if NESTEROV:
        u = g + beta * (buf - g)
    else:
        u = buf
    tl.store(out_ptr + i.to(tl.int64) * numel + offs, u.to(tl.bfloat16), mask=mask)


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
