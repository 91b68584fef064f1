"""Probe `moe_load`: expert load imbalance of the grouped-GEMM experts.

steps.jsonl `moe_load_max_mean`: the mean over every experts call of the step (all layers and micro-batches) of
max / mean tokens per local expert; 1.0 = perfectly balanced. Adds two small reductions per call, no host sync.
The megatron engine routes with `moe_router_force_load_balancing` (seeded random logits, as NVIDIA's performance
runs), so the load does not depend on the weights or the optimizer: it measures the forced routing's balance.
Needs the engine's `GroupedMMExperts` (no Transformer Engine, MUONBENCH_MEGATRON_EXPERTS unset).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from bench import probes


class ExpertLoad:
    """Accumulates, on the device, max / mean tokens per local expert over `GroupedMMExperts` calls (diagnostic:
    a model whose routing grew less balanced runs its grouped GEMMs longer for the same FLOPs)."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.calls = 0

    def add(self, tokens_per_expert: torch.Tensor) -> None:
        t = tokens_per_expert.detach().float()
        ratio = t.max() / t.mean().clamp_min(1e-9)
        self.total = ratio if self.total is None else self.total + ratio
        self.calls += 1

    def take(self) -> float | None:
        """Mean ratio since the last take (one host read), or None without calls; resets."""
        if self.total is None:
            return None
        out = float(self.total) / self.calls
        self.total, self.calls = None, 0
        return out


class Probe(probes.Probe):
    keys: ClassVar[tuple[str, ...]] = ("moe_load_max_mean",)

    def setup(self, engine: Any) -> None:
        from bench.engines.megatron_experts import GroupedMMExperts

        experts = [m for c in engine.model_chunks for m in c.modules() if isinstance(m, GroupedMMExperts)]
        if not experts:
            raise ValueError(
                "probe moe_load counts tokens in the grouped-GEMM experts: needs no Transformer Engine and "
                f"MUONBENCH_MEGATRON_EXPERTS unset (engine experts: {engine.describe().get('experts')!r})"
            )
        self.load = ExpertLoad()

        def count(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.load.add(args[1] if len(args) > 1 else kwargs["tokens_per_expert"])

        self.hooks = [m.register_forward_pre_hook(count, with_kwargs=True) for m in experts]

    def after_step(self) -> dict[str, float]:
        value = self.load.take()
        return {} if value is None else {"moe_load_max_mean": value}

    def teardown(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []
