"""MOP: Momentum Orthogonalized by Polar decomposition (emerging-optimizers 0.3.0 `MOP`, experimental there).

Update = polar(m) * scale, with polar(m) = U V^T of m = U S V^T and, by default, scale = sum(S) (the nuclear
norm, PolarGrad arXiv:2505.21799) times extra_scale_factor; Muon's shape scale modes are also allowed.
polar_method "svd" is exact (batched torch.linalg.svd); "polar_express" runs Newton-Schulz with the Polar Express
coefficients and takes the nuclear norm as <polar(m), m>_F = tr(U^T m), exact when polar(m) is.
Momentum, weight decay, grouping and non-finite handling are those of Muon (OrthogonalizedOptimizer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from optim.configs import MOPConfig
from optim.functional.newton_schulz import newton_schulz
from optim.functional.polar import polar_svd
from optim.functional.split import RowSplit
from optim.optimizers.orthogonalized import OrthogonalizedOptimizer

NS_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class MOP(OrthogonalizedOptimizer):
    """MOP over 2-D matrices and 3-D expert stacks (args as Muon, config MOPConfig)."""

    config: MOPConfig

    def __init__(
        self,
        params: Any,
        config: MOPConfig | None = None,
        *,
        splits: Mapping[torch.Tensor, RowSplit] | None = None,
    ) -> None:
        super().__init__(params, config or MOPConfig(), splits=splits)

    def _orthogonalize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        cfg = self.config
        if cfg.polar_method == "svd":
            orth, s = polar_svd(x)
            nuclear = s.sum(-1).to(x.dtype)
        else:
            orth = newton_schulz(
                x,
                num_steps=cfg.num_ns_steps,
                coefficients="polar_express",
                compute_dtype=NS_DTYPES[cfg.ns_precision],
                eps=cfg.eps,
            )
            nuclear = (orth * x).sum(dim=(-2, -1))
        return orth, (nuclear if cfg.scale_mode == "nuclear_norm" else None)
