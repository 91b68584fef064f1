"""Memory-bound halves of a Muon step for a same-shape group of parameters, one launch each.

- `momentum_pack(grads, bufs, beta, nesterov)`: buf <- buf + (1 - beta)(g - buf) in place, and the NS input
  (g + beta (buf - g) with Nesterov, else buf) written as one stacked (B, r, c) bf16 tensor. 14 bytes per
  element (read g, buf; write buf, bf16 input) instead of ~40 through separate foreach, stack and cast kernels.
- `momentum_pack_with_norms`: the same pass, also returning each NS matrix's squared Frobenius norm (the NS entry's
  normalization and the momentum screen of the fused Muon step, with no pass of their own).
- `nonfinite(tensors)`: per-tensor NaN/Inf flags of same-shape tensors in one launch (the gradient screen).
- `apply_update(params, update, lr, weight_decay, scale)`: p <- p (1 - lr wd) - lr scale update[i], decoupled
  weight decay fused; reads the stacked bf16 NS output once.

- `scale_cast(x, scale, dtype)`: x[i] * scale[i] for each matrix of a contiguous (B, r, c) stack, cast to dtype in
  the same pass (the Frobenius normalization at the NS entry: 4 bytes per element; torch's broadcast multiply ran
  at less than half of that bandwidth, docs/ns_kernels_h200.md#kernel-design-numbers).

- `stacked_runs(tensors)`: the tensors as few (n, r, c) views as possible (runs of equally strided tensors of one
  storage, e.g. matrices laid out back to back in one buffer): where a bucket's parameters are such runs, its last NS
  product can write the update into them (`optim.kernels.ns_batched.LastProduct`).

`transpose=True` (momentum_pack) writes each NS input as (c, r) and `transposed=True` (apply_update) reads each
update as (c, r): a tall (r > c) matrix is orthogonalized in its wide orientation (Newton-Schulz iterates on the
short side) without the two strided transpose copies (in and out) that the NS entry and the update would otherwise
make; 2-D tiles, the transpose through shared memory.

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


def _fast_ok(tensors: Sequence[torch.Tensor], checked: bool = False) -> bool:
    """The Triton path may run: no earlier failure, CUDA and Triton present, and every tensor CUDA fp32
    contiguous (`checked`: the caller guarantees dtype and layout, and one device per call; only the first
    tensor's device is looked at, saving host time per tensor)."""
    from optim.kernels import available

    if TRITON_FAILURE or not available():
        return False
    if checked:
        return tensors[0].is_cuda
    return all(t.is_cuda and t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


def momentum_pack_torch(
    grads: Sequence[torch.Tensor],
    bufs: Sequence[torch.Tensor],
    *,
    beta: float,
    nesterov: bool,
    transpose: bool = False,
    write_buf: bool = True,
) -> torch.Tensor:
    """Reference: foreach momentum update, then stack of the NS inputs in bf16 ((B, c, r) contiguous when
    `transpose`); `write_buf=False` leaves the buffers as they were."""
    if write_buf:
        torch._foreach_lerp_(list(bufs), list(grads), 1.0 - beta)
    else:
        bufs = torch._foreach_lerp(list(bufs), list(grads), 1.0 - beta)
    src = torch._foreach_lerp(list(grads), list(bufs), beta) if nesterov else list(bufs)
    out = torch.stack(src).to(torch.bfloat16)
    return out.mT.contiguous() if transpose else out


def apply_update_torch(
    params: Sequence[torch.Tensor],
    update: torch.Tensor,
    *,
    lr: float,
    weight_decay: float,
    scale: float,
    transposed: bool = False,
) -> None:
    """Reference: p <- p (1 - lr wd) - lr scale update[i] (update[i].T when `transposed`)."""
    for p, u in zip(params, update.unbind(0), strict=True):
        if weight_decay:
            p.mul_(1.0 - lr * weight_decay)
        p.add_((u.T if transposed else u).to(p.dtype), alpha=-lr * scale)


# 2-D tiles of the transposing kernels (rows x cols of the parameter).
_TILE_R, _TILE_C = 64, 64


def momentum_pack(
    grads: Sequence[torch.Tensor],
    bufs: Sequence[torch.Tensor],
    *,
    beta: float,
    nesterov: bool,
    transpose: bool = False,
    checked: bool = False,
    write_buf: bool = True,
) -> torch.Tensor:
    """See module docstring; grads and bufs: B tensors of one shape (r, c). Returns (B, r, c) bf16, or (B, c, r)
    when `transpose`. `checked`: the caller guarantees fp32 contiguous tensors on one device (see `_fast_ok`).
    `write_buf=False`: the NS input of the updated momentum, the buffers left unchanged (10 bytes per element; the
    speculative NS of `Muon.speculate`, whose momentum is written at the step)."""
    out, _ = _pack(grads, bufs, beta, nesterov, transpose, checked, write_buf, pieces=0)
    return out


def momentum_pack_with_norms(
    grads: Sequence[torch.Tensor],
    bufs: Sequence[torch.Tensor],
    *,
    beta: float,
    nesterov: bool,
    transpose: bool = False,
    pieces: int = 1,
    checked: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`momentum_pack` that also returns the squared Frobenius norm of every NS matrix it wrote: (B * pieces,) fp32,
    the sum of squares of the bf16 values of matrix i's piece j at [i * pieces + j], where a (r, c) matrix is
    `pieces` equal row blocks (r / pieces, c) (`transpose=False`; a transposed stack is one piece per matrix).

    The sums come from the same pass (one fp32 partial per Triton program, added up by one small reduction
    afterwards, in a fixed order: deterministic), so the NS entry needs no norm pass of its own, and a NaN or Inf
    anywhere in a matrix makes its sum non-finite (the momentum screen of the fused Muon step)."""
    if pieces < 1 or (pieces > 1 and (transpose or grads[0].size(0) % pieces)):
        raise ValueError(
            f"pieces={pieces} with transpose={transpose}, rows={grads[0].size(0)}: pieces must be >= 1 and divide "
            "the rows of an untransposed stack"
        )
    out, sumsq = _pack(grads, bufs, beta, nesterov, transpose, checked, True, pieces=pieces)
    assert sumsq is not None
    return out, sumsq


def _sumsq_of(out: torch.Tensor, pieces: int) -> torch.Tensor:
    """(B * pieces,) fp32 sums of squares of the (B, r, c) stack `out` cut into `pieces` row blocks per matrix."""
    return out.reshape(out.size(0) * pieces, -1).float().square().sum(-1)


def _pack(
    grads: Sequence[torch.Tensor],
    bufs: Sequence[torch.Tensor],
    beta: float,
    nesterov: bool,
    transpose: bool,
    checked: bool,
    write_buf: bool,
    pieces: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """momentum_pack (`pieces=0`) or momentum_pack_with_norms (`pieces >= 1`)."""

    def reference() -> tuple[torch.Tensor, torch.Tensor | None]:
        out = momentum_pack_torch(
            grads, bufs, beta=beta, nesterov=nesterov, transpose=transpose, write_buf=write_buf
        )
        return out, (_sumsq_of(out, pieces) if pieces else None)

    if not _fast_ok([*grads, *bufs], checked) or (transpose and grads[0].ndim != 2):
        return reference()
    import triton

    from optim.kernels._fused_step_triton import momentum_pack_kernel, momentum_pack_t_kernel

    nb, numel = len(grads), grads[0].numel()
    shape = tuple(grads[0].shape)
    dev = grads[0].device
    out = torch.empty((nb, *(shape[::-1] if transpose else shape)), dtype=torch.bfloat16, device=dev)
    block = 2048
    if transpose:
        r, c = shape
        grid: tuple[int, int, int] | tuple[int, int] = (triton.cdiv(r, _TILE_R), triton.cdiv(c, _TILE_C), nb)
        parts_per_matrix = grid[0] * grid[1]
    else:
        grid = (triton.cdiv(numel, block), nb)
        parts_per_matrix = grid[0]
    # The partials of a piece are whole programs' sums only when each program lies in one piece.
    by_parts = pieces == 1 or (numel // max(pieces, 1)) % block == 0
    parts = (
        torch.empty((nb, parts_per_matrix), dtype=torch.float32, device=dev) if pieces and by_parts else out
    )
    try:
        if transpose:
            momentum_pack_t_kernel[grid](
                _ptrs(grads), _ptrs(bufs), out, parts, r, c, float(beta),
                NESTEROV=nesterov, WRITE_BUF=write_buf, SUMSQ=parts is not out, BR=_TILE_R, BC=_TILE_C,
                num_warps=4,
            )  # fmt: skip
        else:
            momentum_pack_kernel[grid](
                _ptrs(grads), _ptrs(bufs), out, parts, numel, float(beta),
                NESTEROV=nesterov, WRITE_BUF=write_buf, SUMSQ=parts is not out, BLOCK=block, num_warps=8,
            )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - before any store (compile/launch); recorded, torch path from now on
        TRITON_FAILURE.append(f"momentum_pack: {type(e).__name__}: {str(e)[:300]}")
        return reference()
    if not pieces:
        return out, None
    if parts is out:  # pieces that split a program's block: one norm pass over the output
        return out, _sumsq_of(out, pieces)
    return out, parts.view(nb * pieces, -1).sum(-1)


def nonfinite(
    tensors: Sequence[torch.Tensor], *, checked: bool = False, out: torch.Tensor | None = None
) -> torch.Tensor:
    """(len(tensors),) int32 on their device: 1 where the tensor holds a NaN or an Inf, else 0. Tensors of one
    shape; on CUDA (fp32 contiguous) one Triton launch reads each once (4 bytes per element), with no per-tensor
    outputs or host work (`torch._foreach_norm` made one output tensor and launch group per tensor:
    docs/ns_kernels_h200.md#kernel-design-numbers). Elsewhere the torch reference.

    `out`: a zeroed (len(tensors),) int32 tensor to write the flags into (e.g. a slice of one buffer for several
    shape groups, read back with one copy); returned."""
    if out is not None and (out.shape != (len(tensors),) or out.dtype != torch.int32):
        raise ValueError(
            f"out: shape {tuple(out.shape)}, dtype {out.dtype}; need ({len(tensors)},) torch.int32, zeroed"
        )
    if not _fast_ok(tensors, checked):
        flags = _nonfinite_torch(tensors)
        return flags if out is None else out.copy_(flags)
    import triton

    from optim.kernels._fused_step_triton import nonfinite_kernel

    numel = tensors[0].numel()
    flags = torch.zeros(len(tensors), dtype=torch.int32, device=tensors[0].device) if out is None else out
    block = 4096
    try:
        nonfinite_kernel[(triton.cdiv(numel, block), len(tensors))](
            _ptrs(tensors), flags, numel, BLOCK=block, num_warps=8
        )
    except Exception as e:  # noqa: BLE001 - see momentum_pack
        TRITON_FAILURE.append(f"nonfinite: {type(e).__name__}: {str(e)[:300]}")
        return flags.copy_(_nonfinite_torch(tensors))
    return flags


def _nonfinite_torch(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.stack([(~torch.isfinite(t)).any() for t in tensors]).to(torch.int32)


def apply_update(
    params: Sequence[torch.Tensor],
    update: torch.Tensor,
    *,
    lr: float,
    weight_decay: float,
    scale: float,
    transposed: bool = False,
    checked: bool = False,
) -> None:
    """See module docstring; update: (B, r, c) with params[i].shape == (r, c), or (B, c, r) when `transposed`.
    `checked`: as for `momentum_pack`."""
    if (
        not _fast_ok(params, checked)
        or update.dtype != torch.bfloat16
        or (transposed and params[0].ndim != 2)
    ):
        apply_update_torch(
            params, update, lr=lr, weight_decay=weight_decay, scale=scale, transposed=transposed
        )
        return
    import triton

    from optim.kernels._fused_step_triton import apply_update_kernel, apply_update_t_kernel

    update = update.contiguous()
    nb, numel = len(params), params[0].numel()
    decay, step = float(1.0 - lr * weight_decay), float(-lr * scale)
    block = 2048
    try:
        if transposed:
            r, c = params[0].shape
            grid = (triton.cdiv(r, _TILE_R), triton.cdiv(c, _TILE_C), nb)
            apply_update_t_kernel[grid](
                _ptrs(params), update, r, c, decay, step, BR=_TILE_R, BC=_TILE_C, num_warps=4
            )
        else:
            apply_update_kernel[(triton.cdiv(numel, block), nb)](
                _ptrs(params), update, numel, decay, step, BLOCK=block, num_warps=8
            )
    except Exception as e:  # noqa: BLE001 - see momentum_pack
        TRITON_FAILURE.append(f"apply_update: {type(e).__name__}: {str(e)[:300]}")
        apply_update_torch(
            params, update, lr=lr, weight_decay=weight_decay, scale=scale, transposed=transposed
        )


def scale_cast(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x (B, r, c) contiguous, scale (B,) or (B, 1, 1) fp32: returns x[i] * scale[i] in `dtype` (product in fp32).
    Triton on CUDA, torch otherwise (and after a Triton failure)."""
    scale = scale.reshape(-1)
    if not (
        x.is_contiguous() and x.ndim == 3 and scale.dtype == torch.float32 and _fast_ok([x], checked=True)
    ):
        return _scale_cast_torch(x, scale, dtype)
    import triton

    from optim.kernels._fused_step_triton import scale_cast_kernel

    nb, numel = x.size(0), x[0].numel()
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    block = 4096
    try:
        scale_cast_kernel[(triton.cdiv(numel, block), nb)](
            x, scale.contiguous(), out, numel, BLOCK=block, num_warps=8
        )
    except Exception as e:  # noqa: BLE001 - see momentum_pack
        TRITON_FAILURE.append(f"scale_cast: {type(e).__name__}: {str(e)[:300]}")
        return _scale_cast_torch(x, scale, dtype)
    return out


def _scale_cast_torch(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    torch.mul(x, scale.view(-1, *([1] * (x.ndim - 1))), out=out)
    return out


def storage_order(tensors: Sequence[torch.Tensor]) -> list[int]:
    """Indices of `tensors` sorted by (storage address, offset): matrices of one buffer in memory order."""
    return sorted(
        range(len(tensors)),
        key=lambda i: (tensors[i].untyped_storage().data_ptr(), tensors[i].storage_offset()),
    )


def stacked_runs(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Contiguous same-shape 2-D `tensors`, in order, as (n, r, c) views: each view covers a maximal run of
    consecutive tensors that share a storage at one stride (offset i of the run = offset 0 + i * stride, stride >=
    r * c); writing a view writes those tensors. One view per tensor where nothing is shared."""
    runs: list[torch.Tensor] = []
    i = 0
    while i < len(tensors):
        t0 = tensors[i]
        if t0.ndim != 2 or not t0.is_contiguous():
            raise ValueError(
                f"stacked_runs: tensor {i} is {tuple(t0.shape)}, contiguous={t0.is_contiguous()}"
            )
        base, off0, numel = t0.untyped_storage().data_ptr(), t0.storage_offset(), t0.numel()
        j, stride = i + 1, 0
        while j < len(tensors):
            t = tensors[j]
            step = t.storage_offset() - off0
            ok = (
                t.shape == t0.shape
                and t.dtype == t0.dtype
                and t.is_contiguous()
                and t.untyped_storage().data_ptr() == base
                and step >= (j - i) * numel
                and (stride == 0 or step == (j - i) * stride)
            )
            if not ok:
                break
            stride = stride or int(step)
            j += 1
        n = j - i
        runs.append(t0.as_strided((n, *t0.shape), (stride or numel, t0.size(1), 1)))
        i = j
    return runs
