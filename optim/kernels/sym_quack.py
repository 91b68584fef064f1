"""QuACK (CuTe-DSL) products for the batched Newton-Schulz bodies: an optional peer of the Triton kernels.

quack-kernels (the `quack` extra of this package, pinned; https://github.com/Dao-AILab/quack) provides

    gemm_symmetric(A, B, C, alpha=, beta=) = alpha A B + beta C    for a product known to be symmetric
    gemm_add(A, B, C, alpha=, beta=)       = alpha A B + beta C    general
    gemm_add_inplace(A, B, D, alpha=, beta=) : D <- alpha A B + beta D  (D fp32, any strides: `accumulate`)

and `first_step` runs the first NS step on the unnormalized iterate with each matrix's normalization in the epilogue
of its symmetric products (`optim.kernels._quack_scaled`: QuACK's SM90 symmetric kernel with a per-matrix scale,
SM90 only, `first_step_usable`).

The symmetric GEMM computes the lower triangle of output tiles on a persistent triangular schedule and writes each
off-diagonal tile twice (itself and its mirror, both through TMA stores); on SM90 its tiles are 128 x 256 in
2-CTA clusters (one 256 x 256 square per cluster), cooperative warp groups with a producer warp. That is the
`MatOps.gram` / `MatOps.sym` contract of `optim.kernels.ns_batched`. `QuackOps(general=True)` also runs the
general products (`apply`: X <- a X + P X, `full`) as gemm_add does, in QuACK's default SM90 config (pingpong
128 x 192 tiles, 2 x 1 clusters; no autotuning: its tuner compiles tens of configs per shape); `general=False`
leaves them to cuBLAS. `QuackOps(general=True, config=NAME)` runs them with one of the explicit SM90 configs of
GENERAL_CONFIGS instead (QuACK's `gemm_tuned.fn` with `config=`: no autotuning, no pruning), or, for a NAME of
SYMMETRIC_CONFIGS, runs the symmetric products in that tile config (QuACK's symmetric dispatch,
`quack.gemm_symmetric.gemm_symmetric`, which takes the tile arguments that its interface fixes per architecture;
`sym128paired`: QuACK's kernel on our paired schedule, `optim.kernels._quack_paired`) and the general products in
QuACK's default.

Nothing here is imported before a QuACK body runs: the plan lists the QuACK candidates from the installed
version (package metadata, no import) and the device's compute capability (`usable`). The first call of each
kernel variant JIT-compiles it (seconds); the plan times a candidate only after that warm-up and reports the
warm-up separately. Operands need 16-byte rows for TMA: both matrix dimensions a multiple of 8 (`aligned`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import torch

from optim.kernels.ns_batched import TorchOps

# The version this code was written and measured against (the `quack` extra pins it).
QUACK_VERSION = "0.6.5"
# Smallest compute capability the plan offers QuACK on (Hopper; QuACK also builds SM80 and SM100+ kernels).
MIN_CAPABILITY = 9


@dataclass(frozen=True, slots=True)
class GeneralConfig:
    """One SM90 GemmConfig of QuACK's general product (fields of `quack.gemm_config.GemmConfig`)."""

    tile_m: int
    tile_n: int
    pingpong: bool
    cluster_m: int
    cluster_n: int


# Explicit SM90 configs for the general product D = a C + P X (M = m, N = n, K = m, batched), picked from QuACK's
# own tuning space (`quack.gemm_config._get_sm90_configs`) for the Muon shapes, where QuACK's default (pingpong
# 128 x 192, 2 x 1 cluster) stays well below the bf16 ceiling (docs/ns_kernels_h200.md#kernel-design-numbers).
# Per CTA and k-step the default loads 128 + 192 / 2 rows of A and B from L2 for
# 2 x 128 x 192 MACs (110 FLOP per byte); the ones below load fewer bytes per FLOP, their tiles cover every
# expert batch and large single matrix of bench.tools.ns_kernels with at most 5% padding, and the cluster multicasts
# the operand that its pair of CTAs shares:
# - coop256x208_cl1x2: cooperative 256 x 208 (two warp groups of 128 x 208), 1 x 2 cluster sharing A: 158 FLOP
#   per byte, the most of the tuning space; 208 fp32 accumulators per thread.
# - coop128x256_cl2x1: cooperative 128 x 256 (two warp groups of 64 x 256, the widest wgmma), 2 x 1 cluster
#   sharing B: 128 FLOP per byte with no padding on any of these shapes (m a multiple of 256, n of 256), 128
#   accumulators per thread.
# Cooperative tiles run the epilogue (read C, write D) between mainloops where pingpong overlaps it with the other
# warp group's mainloop; at K = 768 that can cost more than the L2 traffic saves: the plan measures it.
GENERAL_CONFIGS: dict[str, GeneralConfig] = {
    "coop256x208_cl1x2": GeneralConfig(tile_m=256, tile_n=208, pingpong=False, cluster_m=1, cluster_n=2),
    "coop128x256_cl2x1": GeneralConfig(tile_m=128, tile_n=256, pingpong=False, cluster_m=2, cluster_n=1),
}


@dataclass(frozen=True, slots=True)
class SymmetricConfig:
    """One SM90 tile config of QuACK's symmetric GEMM (arguments of `quack.gemm_symmetric.gemm_symmetric`). Its
    persistent triangular schedule needs one square output tile per cluster: tile_n == tile_m * cluster_m. With
    `paired`, square tiles in 2 x 1 clusters on the paired schedule instead (`optim.kernels._quack_paired`: each
    cluster takes two tiles of one tile column, any rows), through the per-matrix scaled kernel."""

    tile_m: int
    tile_n: int
    cluster_m: int
    pingpong: bool
    paired: bool = False

    def __post_init__(self) -> None:
        if self.paired:
            if (self.tile_m, self.tile_n, self.cluster_m, self.pingpong) != (128, 128, 2, True):
                raise ValueError(
                    f"tile_m={self.tile_m}, tile_n={self.tile_n}, cluster_m={self.cluster_m}, "
                    f"pingpong={self.pingpong}: the paired schedule runs 128 x 128 pingpong tiles in 2 x 1 clusters"
                )
        elif self.tile_n != self.tile_m * self.cluster_m:
            raise ValueError(
                f"tile_m={self.tile_m}, tile_n={self.tile_n}, cluster_m={self.cluster_m}: a cluster's output tile "
                "must be square (tile_n == tile_m * cluster_m)"
            )


# QuACK fixes 128 x 256 tiles in 2 x 1 clusters (cooperative) for its SM90 symmetric GEMM. On the short-K polynomial
# step b A + c A^2 (K = m = 768: Qwen3's fc2 and split gate/up halves) 128 x 128 pingpong tiles, one warp group's
# epilogue (read A, write two tiles) overlapping the other's mainloop, are faster, and slower on fc1's X X^T
# (m = 1536). The same tiles on the paired schedule compute the same 78 tiles of a 1536-row triangle in 2-CTA
# clusters that multicast their shared panel. The plan measures each per shape (docs/ns_kernels_h200.md#kernel-design-numbers).
SYMMETRIC_CONFIGS: dict[str, SymmetricConfig] = {
    "sym128pp": SymmetricConfig(tile_m=128, tile_n=128, cluster_m=1, pingpong=True),
    "sym128paired": SymmetricConfig(tile_m=128, tile_n=128, cluster_m=2, pingpong=True, paired=True),
}
# Compute capability of the configs above (QuACK builds them for SM90 only; SM100+ has other tile rules).
CONFIG_CAPABILITY = 9


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


def configs_usable(device: torch.device) -> bool:
    """`usable` on an SM90 device: where the GENERAL_CONFIGS and SYMMETRIC_CONFIGS are offered."""
    return usable(device) and torch.cuda.get_device_capability(device)[0] == CONFIG_CAPABILITY


def first_step_usable(device: torch.device) -> bool:
    """Where `QuackOps.first_step` runs: its per-matrix scaled symmetric kernel is QuACK's SM90 one (`usable`, SM90)."""
    return configs_usable(device)


def aligned(m: int, n: int) -> bool:
    """Every operand row is a multiple of 16 bytes in bf16 / fp16 (TMA), for an (m, n) iterate and its m x m Gram."""
    return m % 8 == 0 and n % 8 == 0


@functools.cache
def _iface() -> Any:
    import quack.gemm_interface

    return quack.gemm_interface


@functools.cache
def _symmetric_dispatch() -> Any:
    import quack.gemm_symmetric

    return quack.gemm_symmetric.gemm_symmetric


@functools.cache
def _paired() -> Any:
    """`optim.kernels._quack_paired.paired_symmetric` (imports QuACK's CuTe DSL)."""
    from optim.kernels._quack_paired import paired_symmetric

    return paired_symmetric


def _scaled_kernel(cfg: SymmetricConfig) -> Any:
    """The per-matrix scaled symmetric kernel in cfg's tiles (`optim.kernels._quack_scaled.scaled_symmetric`), or on
    the paired schedule: a call (a, b, out, scale_ab, c, scale_c)."""
    if cfg.paired:
        return _paired()
    from optim.kernels._quack_scaled import scaled_symmetric

    return functools.partial(
        scaled_symmetric, tile_m=cfg.tile_m, tile_n=cfg.tile_n, cluster_m=cfg.cluster_m, pingpong=cfg.pingpong
    )


@functools.cache
def _default_general_config(device: torch.device) -> Any:
    """QuACK's default GemmConfig for `device` (`quack.gemm_config.default_config`: what `gemm_add(..., tuned=False)`
    runs a product with an epilogue operand in; on SM90 pingpong 128 x 192 tiles, 2 x 1 clusters)."""
    from quack.gemm_config import default_config

    return default_config(device)


@functools.cache
def _gemm_config(name: str) -> Any:
    """QuACK's GemmConfig of GENERAL_CONFIGS[name] (static persistent scheduler, as QuACK's SM90 tuning space)."""
    from quack.gemm_config import GemmConfig

    c = GENERAL_CONFIGS[name]
    return GemmConfig(
        tile_m=c.tile_m,
        tile_n=c.tile_n,
        pingpong=c.pingpong,
        cluster_m=c.cluster_m,
        cluster_n=c.cluster_n,
        is_dynamic_persistent=False,
        device_capacity=CONFIG_CAPABILITY,
    )


class QuackOps:
    """`MatOps` with the symmetric products in QuACK's gemm_symmetric (with a SYMMETRIC_CONFIGS `config`, in that
    tile config); general products in QuACK's gemm_add (`general=True`; with a GENERAL_CONFIGS `config`, in that
    config) or cuBLAS."""

    def __init__(self, *, general: bool, config: str | None = None) -> None:
        known = [*GENERAL_CONFIGS, *SYMMETRIC_CONFIGS]
        if config is not None and (not general or config not in known):
            raise ValueError(
                f"config={config!r} with general={general}: a config needs general=True and one of {known}"
            )
        self.general = general
        self.config = config
        self.symmetric = SYMMETRIC_CONFIGS.get(config) if config is not None else None
        self._row_cache: dict[tuple[int, int, torch.device, float], torch.Tensor] = {}

    def _symmetric_product(
        self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, alpha: float, beta: float
    ) -> torch.Tensor:
        """alpha a b^T (+ beta c) for a symmetric result, (l, m, k) operands, in self.symmetric's tiles (B passed
        as QuACK's dispatch takes it: operand-shaped (l, m, k), as its interface relabels b^T)."""
        cfg = self.symmetric
        assert cfg is not None
        out = torch.empty((*a.shape[:-1], a.shape[-2]), dtype=a.dtype, device=a.device)
        if cfg.paired:
            a3, b3, out3 = (t.view(-1, *t.shape[-2:]) for t in (a, b, out))
            c3 = None if c is None else c.view(-1, *c.shape[-2:])
            rows = (a3.shape[0], a3.shape[1], a.device)
            v = None if c is None else self._rows(*rows, beta)
            _scaled_kernel(cfg)(a3, b3, out3, self._rows(*rows, alpha), c3, v)
            return out
        _symmetric_dispatch()(
            a,
            b,
            out,
            c,
            None,
            tile_M=cfg.tile_m,
            tile_N=cfg.tile_n,
            cluster_M=cfg.cluster_m,
            cluster_N=1,
            pingpong=cfg.pingpong,
            persistent=True,
            is_dynamic_persistent=False,
            max_swizzle_size=8,
            alpha=float(alpha),
            beta=float(beta) if c is not None else 1.0,
        )
        return out

    def _rows(self, batch: int, m: int, device: torch.device, value: float) -> torch.Tensor:
        """A (batch, m) fp32 tensor of `value`: the per-matrix scale vector of the scaled kernels, for a constant
        scale (cached: an NS call asks for the same few values on every call)."""
        key = (batch, m, device, float(value))
        t = self._row_cache.get(key)
        if t is None:
            t = self._row_cache[key] = torch.full((batch, m), float(value), device=device)
        return t

    def gram(self, x: torch.Tensor) -> torch.Tensor:
        if self.symmetric is not None:
            return self._symmetric_product(x, x, None, 1.0, 1.0)
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
        if self.symmetric is not None:
            out = self._symmetric_product(a, b, d, alpha, beta)
        elif d is None:
            out = _iface().gemm_symmetric(a, b.mT, alpha=float(alpha))
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
        # gemm_add(..., tuned=False) calls gemm_tuned.fn (the function under QuACK's autotuner) with config=None,
        # which runs QuACK's default config; called here directly with the config (the default's, or an explicit
        # one): the same kernel, without gemm_add's per-call argument handling (host time: docs/ns_kernels_h200.md#kernel-design-numbers)
        if self.config is None or self.symmetric is not None:
            cfg = _default_general_config(a.device)
        else:
            cfg = _gemm_config(self.config)
        out = torch.empty(d.shape, dtype=a.dtype, device=a.device)
        _iface().gemm_tuned.fn(a, b, out, d, alpha=float(alpha), beta=float(beta), config=cfg)
        return out

    def apply(self, p: torch.Tensor, x: torch.Tensor, beta: float) -> torch.Tensor:
        return self.full(p, x, 1.0, x, beta)

    def first_step(
        self, g: torch.Tensor, scale: torch.Tensor, coeff: tuple[float, float, float]
    ) -> torch.Tensor:
        """`FoldingOps.first_step`: A = s^2 G G^T and P' = s (c A^2 + b A) + s a I in the per-matrix scaled
        symmetric kernel (this instance's symmetric tile config or paired schedule, or QuACK's SM90 default),
        X_1 = P' G in QuACK's general product (its default config; cuBLAS with `general=False`)."""
        a, b, c = coeff
        nb, m, _ = g.shape
        rows = scale.view(-1, 1).expand(nb, m)
        scaled = _scaled_kernel(
            self.symmetric or SymmetricConfig(tile_m=128, tile_n=256, cluster_m=2, pingpong=False)
        )
        gram = torch.empty((nb, m, m), dtype=g.dtype, device=g.device)
        scaled(g, g, gram, (rows * rows).contiguous(), None, None)
        p = torch.empty_like(gram)
        scaled(gram, gram, p, (c * rows).contiguous(), gram, (b * rows).contiguous())
        p.diagonal(dim1=-2, dim2=-1).add_((a * scale).view(-1, 1))
        if not self.general:
            return torch.bmm(p, g)
        out: torch.Tensor = _iface().gemm(p, g, tuned=False)
        return out

    def accumulate(
        self, p: torch.Tensor, x: torch.Tensor, out: torch.Tensor, alpha: float, beta: float
    ) -> None:
        """out <- beta out + alpha p x in one GEMM into the fp32 out, any strides (QuACK's gemm_add_inplace,
        its default config); with `general=False` cuBLAS's product, added in fp32 (`TorchOps.accumulate`)."""
        if not self.general:
            TorchOps().accumulate(p, x, out, alpha, beta)
            return
        _iface().gemm_add_inplace(p, x, out, alpha=float(alpha), beta=float(beta), tuned=False)
