"""SOAP / KL-Shampoo building blocks on batched (B, m, n) gradients.

SOAP (arXiv 2409.11321): Kronecker factors L ~ E[G G^T] (m x m), R ~ E[G^T G] (n x n); eigenbases Q_L, Q_R;
Adam runs on the rotated gradient Q_L^T G Q_R and its update is rotated back, Q_L U Q_R^T.
KL-Shampoo (arXiv 2509.03378) replaces the factor statistics by

    L <- beta L + (1 - beta) / n * G Q_R diag(lam_R)^-1 Q_R^T G^T
    R <- beta R + (1 - beta) / m * G^T Q_L diag(lam_L)^-1 Q_L^T G

with lam = diag(Q^T F Q) of the previous basis clamped at eps. A side whose Q is None is unpreconditioned
(identity basis); its missing lam is taken as 1 in the other side's KL update.

Numerical caveats: eigh runs in the factor dtype (fp32) and falls back to fp64 when LAPACK/cuSOLVER fails;
eigenvectors come back with eigenvalues in descending order, as in emerging-optimizers.

Eigh over CUDA streams: for k > 32 torch's batched CUDA eigh loops over one cuSOLVER call per matrix (syevj for
fp32 up to k = 512, syevd above), each latency-bound, so the GPU idles most of the time. `eigh_descending` therefore
splits a CUDA stack of k > 32 into chunks (8 by default, at least 2 matrices each) and runs each chunk's eigh on its
own CUDA stream from its own host thread (the GIL is released inside the call); the streams come from a per-device
pool, start after the caller's stream, and the caller's stream waits on them all. Every matrix goes through the same
cuSOLVER call as in the batched eigh, so the result is identical; the fp64 retry is per chunk (a failing chunk is
recomputed in fp64, the others keep their fp32 result). Why and by how much: docs/soap.md.

Chunks start a multiple of 512 bytes into the stack of matrices and of eigenvalues (fp32 with k a multiple of 128:
at any matrix), so that inside every call each matrix sits at the same alignment as in the single call: LAPACK's
results depend on it (on the host, k = 9 and 33 in fp32 differ in the last bits when a chunk starts off a 16-byte
boundary). Host tensors keep the single call (chunks from host threads were slower there; same report); an
explicit `streams` runs the same chunk code with plain threads on the host. torch's lazy load
of its CUDA linear-algebra library is not thread-safe (the first linalg call of a process from several threads at
once raised "lazy wrapper should be called at most once"), so one tiny eigh runs on the calling thread first, once
per device.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

Basis = torch.Tensor | None


def rotate(x: torch.Tensor, q_l: Basis, q_r: Basis) -> torch.Tensor:
    """Q_L^T x Q_R (into the eigenbasis); x: (B, m, n)."""
    if q_l is not None:
        x = q_l.mT @ x
    if q_r is not None:
        x = x @ q_r
    return x


def rotate_back(x: torch.Tensor, q_l: Basis, q_r: Basis) -> torch.Tensor:
    """Q_L x Q_R^T (back to the parameter basis)."""
    if q_l is not None:
        x = q_l @ x
    if q_r is not None:
        x = x @ q_r.mT
    return x


def approx_eigvals(factor: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """diag(Q^T F Q): (B, k, k) x (B, k, k) -> (B, k)."""
    return (basis * (factor @ basis)).sum(dim=-2)


def factor_updates(g: torch.Tensor, has_l: bool, has_r: bool) -> tuple[Basis, Basis]:
    """Plain Shampoo statistics (G G^T, G^T G) for the sides that are preconditioned."""
    return (g @ g.mT if has_l else None), (g.mT @ g if has_r else None)


def kl_factor_updates(
    g: torch.Tensor, l: Basis, r: Basis, q_l: Basis, q_r: Basis, eps: float
) -> tuple[Basis, Basis]:
    """KL-Shampoo statistics from the current factors and the previous bases (formula in the module doc)."""
    m, n = g.shape[-2:]
    upd_l = upd_r = None
    # Same association as emerging-optimizers (C = Q diag(1/(k lam)) Q^T, then G^T C G): the KL statistics of a
    # rank-deficient factor depend on eigh's arbitrary null-space basis, so rounding-level agreement matters.
    if r is not None:
        assert q_r is not None
        inv = approx_eigvals(r, q_r).clamp_min(eps).reciprocal() / n
        upd_l = (g @ ((q_r * inv.unsqueeze(-2)) @ q_r.mT)) @ g.mT
    elif l is not None:
        upd_l = g @ g.mT / n
    if l is not None:
        assert q_l is not None
        inv = approx_eigvals(l, q_l).clamp_min(eps).reciprocal() / m
        upd_r = (g.mT @ ((q_l * inv.unsqueeze(-2)) @ q_l.mT)) @ g
    elif r is not None:
        upd_r = g.mT @ g / m
    return upd_l, upd_r


DEFAULT_EIGH_STREAMS = 8
_MIN_PER_STREAM = 2  # matrices per chunk: below that a stream does not pay for its thread
_MIN_STREAM_SIDE = 33  # for k <= 32 torch's CUDA eigh is one syevjBatched call over the whole stack
_ALIGN_BYTES = 512  # the CUDA caching allocator's block alignment; the host allocator's (64) divides it

_LOCK = threading.Lock()
_SIDE_STREAMS: dict[int, list[torch.cuda.Stream]] = {}
_LINALG_READY: set[int] = set()


def _eigh_single(factor: torch.Tensor) -> torch.Tensor:
    """One eigh call over the whole stack; fp64 retry on failure; columns by descending eigenvalue."""
    try:
        _, vecs = torch.linalg.eigh(factor)
    except RuntimeError:  # torch.linalg.LinAlgError is a RuntimeError
        _, vecs = torch.linalg.eigh(factor.double())
        vecs = vecs.to(factor.dtype)
    out: torch.Tensor = vecs.flip(-1)
    return out


def _side_streams(device: torch.device, num: int) -> list[torch.cuda.Stream]:
    """`num` streams of `device` from a per-device pool that only grows. The first time per device, one tiny eigh
    runs on the calling thread, so that torch's lazy linalg load never races between the worker threads."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _LOCK:
        if index not in _LINALG_READY:
            torch.linalg.eigh(torch.eye(2, device=torch.device("cuda", index)))
            _LINALG_READY.add(index)
        pool = _SIDE_STREAMS.setdefault(index, [])
        while len(pool) < num:
            pool.append(torch.cuda.Stream(device=index))  # type: ignore[no-untyped-call]
        return pool[:num]


def _chunk_bounds(factor: torch.Tensor, streams: int | None) -> list[tuple[int, int]]:
    """[lo, hi) ranges of the flattened stack, one per chunk (one range: the single call); every lo is a multiple
    of `_ALIGN_BYTES` into the matrices and into the eigenvalues."""
    batch, k = math.prod(factor.shape[:-2]), factor.shape[-1]
    if streams is not None:
        if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
            raise ValueError(
                f"eigh_descending: streams={streams!r}; allowed: None (automatic) or an int >= 1"
            )
        num = streams
    elif factor.is_cuda and k >= _MIN_STREAM_SIDE:
        num = min(DEFAULT_EIGH_STREAMS, batch // _MIN_PER_STREAM)
    else:
        num = 1
    if num <= 1 or batch < 2:
        return [(0, batch)]
    # chunk starts in matrices: a k x k matrix holds k eigenvalues, so this aligns both stacks
    unit = _ALIGN_BYTES // math.gcd(_ALIGN_BYTES, k * factor.element_size())
    units = -(-batch // unit)
    size = -(-units // min(num, units)) * unit
    return [(lo, min(lo + size, batch)) for lo in range(0, batch, size)]


def _eigh_into(out: torch.Tensor, flat: torch.Tensor, lo: int, hi: int) -> None:
    """out[lo:hi] = _eigh_single(flat[lo:hi]) on the current stream."""
    out[lo:hi].copy_(_eigh_single(flat[lo:hi]))


def eigh_descending(factor: torch.Tensor, *, streams: int | None = None) -> torch.Tensor:
    """Eigenvectors of symmetric (..., k, k), columns by descending eigenvalue; fp64 retry on failure.

    Args:
        factor: (..., k, k) symmetric stack.
        streams: chunks of the stack, each run from its own thread and, on CUDA, on its own stream (1: one call
            over the stack). None: 8 for a CUDA stack with k > 32 and at least 2 matrices per chunk, fewer chunks
            for a smaller stack, the single call otherwise. Chunk starts are rounded to keep each matrix's
            alignment (module doc), which can leave fewer chunks than asked.
    """
    bounds = _chunk_bounds(factor, streams)
    if len(bounds) == 1:
        return _eigh_single(factor)
    flat = factor.reshape(-1, *factor.shape[-2:])
    out = torch.empty_like(flat)
    if not factor.is_cuda:
        with ThreadPoolExecutor(len(bounds)) as pool:
            futs = [pool.submit(_eigh_into, out, flat, lo, hi) for lo, hi in bounds]
        for fut in futs:
            fut.result()
        return out.view_as(factor)
    # `flat` and `out` belong to the caller's stream: the side streams start after it and it waits on them all, so
    # neither the caching allocator nor the caller's next kernel can touch them before the chunks are done.
    caller = torch.cuda.current_stream(factor.device)
    side = _side_streams(factor.device, len(bounds))

    def work(stream: torch.cuda.Stream, lo: int, hi: int) -> None:
        stream.wait_stream(caller)
        with torch.cuda.stream(stream):
            _eigh_into(out, flat, lo, hi)

    try:
        with ThreadPoolExecutor(len(bounds)) as pool:
            futs = [pool.submit(work, s, lo, hi) for s, (lo, hi) in zip(side, bounds, strict=True)]
        for fut in futs:
            fut.result()
    finally:
        for s in side:
            caller.wait_stream(s)
    return out.view_as(factor)


def sort_basis(factor: torch.Tensor, basis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns of `basis` by descending diag(Q^T F Q); returns (sorted basis, permutation (B, k))."""
    idx = torch.argsort(approx_eigvals(factor, basis), dim=-1, descending=True)
    return basis.gather(-1, idx.unsqueeze(-2).expand_as(basis)), idx


def qr_power_step(factor: torch.Tensor, basis: torch.Tensor, steps: int) -> torch.Tensor:
    """Orthogonal iteration: `steps` rounds of Q <- qr(F Q).Q."""
    for _ in range(steps):
        basis = torch.linalg.qr(factor @ basis).Q
    return basis


def adam_direction(
    g: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    betas: tuple[float, float],
    eps: float,
    step: int,
    correct_bias: bool,
    nesterov: bool,
) -> torch.Tensor:
    """Adam direction m_hat / (sqrt(v_hat) + eps); updates exp_avg, exp_avg_sq in place. step is 1-based."""
    b1, b2 = betas
    exp_avg.lerp_(g, 1 - b1)
    exp_avg_sq.lerp_(g.square(), 1 - b2)
    bc1 = 1 - b1**step if correct_bias else 1.0
    bc2 = 1 - b2**step if correct_bias else 1.0
    if nesterov:
        bcn = 1 - b1 ** (step + 1) if correct_bias else 1.0
        mom = b1 * exp_avg / bcn + (1 - b1) * g / bc1
    else:
        mom = exp_avg / bc1
    return mom / ((exp_avg_sq / bc2).sqrt() + eps)
