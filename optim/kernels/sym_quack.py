"""QuACK (CuTe-DSL) products for the batched Newton-Schulz bodies: an optional peer of the Triton kernels.

quack-kernels (the `quack` extra of this package, pinned; https://github.com/Dao-AILab/quack) provides

    gemm_symmetric(A, B, C, alpha=, beta=) = alpha A B + beta C    for a product known to be symmetric
    gemm_add(A, B, C, alpha=, beta=)       = alpha A B + beta C    general

The symmetric GEMM computes the lower triangle of output tiles on a persistent triangular schedule and writes each
off-diagonal tile twice (itself and its mirror, both through TMA stores); on SM90 its tiles are 128 x 256 in
2-CTA clusters (one 256 x 256 square per cluster), cooperative warp groups with a producer warp. That is the
`MatOps.gram` / `MatOps.sym` contract of `optim.kernels.ns_batched`. `QuackOps(general=True)` also runs the
general products (`apply`: X <- a X + P X, `full`) through gemm_add with QuACK's default SM90 config (no
autotuning: its tuner compiles tens of configs per shape); `general=False` leaves them to cuBLAS.

Nothing here is imported before a QuACK body runs: the plan lists the QuACK candidates from the installed
version (package metadata, no import) and the device's compute capability (`usable`). The first call of each
kernel variant JIT-compiles it (seconds); the plan times a candidate only after that warm-up and reports the
warm-up separately. Operands need 16-byte rows for TMA: both matrix dimensions a multiple of 8 (`aligned`).
"""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Any

import torch

# The version this code was written and measured against (the `quack` extra pins it).
QUACK_VERSION = "0.6.5"
# Smallest compute capability the plan offers QuACK on (Hopper; QuACK also builds SM80 and SM100+ kernels).
MIN_CAPABILITY = 9


@functools.cache
def quack_version() -> str | None:
    """Installed quack-kernels version from the package metadata (no import), None when not installed."""
    try:
        return metadata.version("quack-kernels")
    except metadata.PackageNotFoundError:
        return None


def usable(device: torch.device) -> bool:
    """quack-kernels installed and the CUDA device at compute capability 9.0 or newer."""
    if quack_version() is None or device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= MIN_CAPABILITY


def aligned(m: int, n: int) -> bool:
    """Every operand row is a multiple of 16 bytes in bf16 / fp16 (TMA), for an (m, n) iterate and its m x m Gram."""
    return m % 8 == 0 and n % 8 == 0


@functools.cache
def _iface() -> Any:
    import quack.gemm_interface

    return quack.gemm_interface


class QuackOps:
    """`MatOps` with the symmetric products in QuACK's gemm_symmetric; general products in QuACK's gemm_add
    (`general=True`) or cuBLAS."""

    def __init__(self, *, general: bool) -> None:
        self.general = general

    def gram(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _iface().gemm_symmetric(x, x.mT)
        return out

    def sym(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        alpha: float,
        d: torch.Tensor | None,
        beta: float,
        diag: float = 0.0,
    ) -> torch.Tensor:
        if d is None:
            out: torch.Tensor = _iface().gemm_symmetric(a, b.mT, alpha=float(alpha))
        else:
            out = _iface().gemm_symmetric(a, b.mT, d, alpha=float(alpha), beta=float(beta))
        if diag:  # no identity term in QuACK's epilogue: one strided add over the diagonal
            out.diagonal(dim1=-2, dim2=-1).add_(diag)
        return out

    def full(
        self, a: torch.Tensor, b: torch.Tensor, alpha: float, d: torch.Tensor, beta: float
    ) -> torch.Tensor:
        if not self.general:
            return torch.baddbmm(d, a, b, beta=beta, alpha=alpha)
        out: torch.Tensor = _iface().gemm_add(a, b, d, alpha=float(alpha), beta=float(beta), tuned=False)
        return out

    def apply(self, p: torch.Tensor, x: torch.Tensor, beta: float) -> torch.Tensor:
        return self.full(p, x, 1.0, x, beta)
