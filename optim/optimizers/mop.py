"""MOP: Momentum Orthogonalized by Polar decomposition (emerging-optimizers 0.3.0 `MOP`, experimental there).

Update = polar(m) * scale, with polar(m) = U V^T of m = U S V^T and, by default, scale = sum(S) (the nuclear
norm, PolarGrad arXiv:2505.21799) times extra_scale_factor; Muon's shape scale modes are also allowed.
polar_method "svd" is exact (batched torch.linalg.svd); "polar_express" runs Newton-Schulz with the Polar Express
coefficients and takes the nuclear norm as <polar(m), m>_F = tr(U^T m), exact when polar(m) is.
Momentum, weight decay, grouping and non-finite handling are those of Muon (OrthogonalizedOptimizer).
Tensor-parallel shards (`tp`, see optim.optimizers.tp) need polar_express (the nuclear norm's inner product is
summed over the TP group) unless every spec is blockwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from optim.configs import MOPConfig, TPMode
from optim.functional.newton_schulz import newton_schulz
from optim.functional.polar import polar_svd
from optim.functional.split import RowSplit
from optim.optimizers.base import config_from
from optim.optimizers.orthogonalized import OrthogonalizedOptimizer
from optim.optimizers.tp import TPModeFn, TPSpec

NS_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class MOP(OrthogonalizedOptimizer):
    """MOP over 2-D matrices and 3-D expert stacks (args as Muon, config MOPConfig)."""

    config: MOPConfig

    def __init__(
        self,
        params: Any,
        config: MOPConfig | float | None = None,
        *,
        splits: Mapping[torch.Tensor, RowSplit] | None = None,
        tp: Mapping[torch.Tensor, TPSpec] | None = None,
        tp_mode_fn: TPModeFn | None = None,
        **hyperparameters: Any,
    ) -> None:
        config = config_from(MOPConfig, config, hyperparameters)
        if config.polar_method == "svd" and any(s.mode != TPMode.BLOCKWISE for s in (tp or {}).values()):
            raise ValueError(
                "polar_method='svd' with tensor-parallel specs supports only mode='blockwise'; use "
                "polar_method='polar_express' for 'duplicated' / 'distributed' / 'auto'"
            )
        super().__init__(params, config, splits=splits, tp=tp, tp_mode_fn=tp_mode_fn)

    def _orthogonalize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._polar(x)

    def _polar(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        cfg = self.config
        if cfg.polar_method == "svd":
            orth, s = polar_svd(x)
            nuclear = s.sum(-1).to(x.dtype)
        else:
            orth = newton_schulz(
                x,
                num_ns_steps=cfg.num_ns_steps,
                coefficients="polar_express",
                compute_dtype=NS_DTYPES[cfg.ns_precision],
                eps=cfg.eps,
            )
            nuclear = (orth * x).sum(dim=(-2, -1))
        return orth, (nuclear if cfg.scale_mode == "nuclear_norm" else None)

    def _orthogonalize_tp(
        self, x: torch.Tensor, *, mode: TPMode, spec: TPSpec, shard_sizes: tuple[int, ...] | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Shards -> (orthogonalized shards, nuclear norm of the whole matrix: <polar, m> summed over the group)."""
        if self.config.polar_method == "svd" or mode == TPMode.BLOCKWISE or spec.size() == 1:
            tall = x.size(-2) > x.size(-1)
            orth, nuclear = self._polar(x.mT if tall else x)
            return (orth.mT if tall else orth), nuclear
        cfg = self.config
        orth = spec.newton_schulz(
            x,
            mode=mode,
            shard_sizes=shard_sizes,
            num_ns_steps=cfg.num_ns_steps,
            coefficients="polar_express",
            compute_dtype=NS_DTYPES[cfg.ns_precision],
            eps=cfg.eps,
        )
        if self.config.scale_mode != "nuclear_norm":
            return orth, None
        nuclear = (orth * x).sum(dim=(-2, -1))
        dist.all_reduce(nuclear, group=spec.group)
        return orth, nuclear
