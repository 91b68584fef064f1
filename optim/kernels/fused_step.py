"""Memory-bound halves of a Muon step for a same-shape group of parameters, one launch each.

- `momentum_pack(grads, bufs, beta, nesterov)`: buf <- buf + (1 - beta)(g - buf) in place, and the NS input
  (g + beta (buf - g) with Nesterov, else buf) written as one stacked (B, r, c) bf16 tensor. 14 bytes per
  element (read g, buf; write buf, bf16 input) instead of ~40 through separate foreach, stack and cast kernels.
- `apply_update(params, update, lr, weight_decay, scale)`: p <- p (1 - lr wd) - lr scale update[i], decoupled
  weight decay fused; reads the stacked bf16 NS output once.

Triton kernels address the separate parameter tensors through a device array of their pointers (grouped-GEMM
pattern of the Triton tutorials); fp32 tensors only. Anything else (CPU, other dtypes) takes the torch path,
which is also the test reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_PTR_CACHE: dict[tuple[int, ...], torch.Tensor] = {}
# Set (to the error text) if a Triton kernel failed to build or launch; later calls take the torch path.
TRITON_FAILURE: list[str] = []


def _ptrs(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    key = tuple(t.data_ptr() for t in tensors)
    hit = _PTR_CACHE.get(key)
    if hit is None:
        if len(_PTR_CACHE) > 4096:
            _PTR_CACHE.clear()
        hit = _PTR_CACHE[key] = torch.tensor(key, dtype=torch.int64, device=tensors[0].device)
    return hit


def _fast_ok(tensors: Sequence[torch.Tensor]) -> bool:
    from optim.kernels import available

    return (
        not TRITON_FAILURE
        and available()
        and all(t.is_cuda and t.dtype == torch.float32 and t.is_contiguous() for t in tensors)
    )


def momentum_pack_torch(
    grads: Sequence[torch.Tensor], bufs: Sequence[torch.Tensor], *, beta: float, nesterov: bool
) -> torch.Tensor:
    """Reference: foreach momentum update, then stack of the NS inputs in bf16."""
    torch._foreach_lerp_(list(bufs), list(grads), 1.0 - beta)
    src = torch._foreach_lerp(list(grads), list(bufs), beta) if nesterov else list(bufs)
    return torch.stack(src).to(torch.bfloat16)


def apply_update_torch(
    params: Sequence[torch.Tensor], update: torch.Tensor, *, lr: float, weight_decay: float, scale: float
) -> None:
    """Reference: p <- p (1 - lr wd) - lr scale update[i]."""
    for p, u in zip(params, update.unbind(0), strict=True):
        if weight_decay:
            p.mul_(1.0 - lr * weight_decay)
        p.add_(u.to(p.dtype), alpha=-lr * scale)


def momentum_pack(
    grads: Sequence[torch.Tensor], bufs: Sequence[torch.Tensor], *, beta: float, nesterov: bool
) -> torch.Tensor:
    """See module docstring; grads and bufs: B tensors of one shape (r, c). Returns (B, r, c) bf16."""
    if not _fast_ok([*grads, *bufs]):
        return momentum_pack_torch(grads, bufs, beta=beta, nesterov=nesterov)
    import triton

    from optim.kernels._fused_step_triton import momentum_pack_kernel

    nb, numel = len(grads), grads[0].numel()
    out = torch.empty((nb, *grads[0].shape), dtype=torch.bfloat16, device=grads[0].device)
    block = 2048
    try:
        momentum_pack_kernel[(triton.cdiv(numel, block), nb)](
            _ptrs(grads), _ptrs(bufs), out, numel, float(beta), NESTEROV=nesterov, BLOCK=block, num_warps=8
        )
    except Exception as e:  # noqa: BLE001 - before any store (compile/launch); recorded, torch path from now on
        TRITON_FAILURE.append(f"momentum_pack: {type(e).__name__}: {str(e)[:300]}")
        return momentum_pack_torch(grads, bufs, beta=beta, nesterov=nesterov)
    return out


def apply_update(
    params: Sequence[torch.Tensor], update: torch.Tensor, *, lr: float, weight_decay: float, scale: float
) -> None:
    """See module docstring; update: (B, r, c) with params[i].shape == (r, c)."""
    if not _fast_ok(params) or update.dtype != torch.bfloat16:
        apply_update_torch(params, update, lr=lr, weight_decay=weight_decay, scale=scale)
        return
    import triton

    from optim.kernels._fused_step_triton import apply_update_kernel

    update = update.contiguous()
    nb, numel = len(params), params[0].numel()
    block = 2048
    try:
        apply_update_kernel[(triton.cdiv(numel, block), nb)](
            _ptrs(params),
            update,
            numel,
            float(1.0 - lr * weight_decay),
            float(-lr * scale),
            BLOCK=block,
            num_warps=8,
        )
    except Exception as e:  # noqa: BLE001 - see momentum_pack
        TRITON_FAILURE.append(f"apply_update: {type(e).__name__}: {str(e)[:300]}")
        apply_update_torch(params, update, lr=lr, weight_decay=weight_decay, scale=scale)
