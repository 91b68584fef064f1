"""The engine interface: one training step behind `setup` / `step` / `teardown`.

An engine builds the model, the data and the optimizer for one rank, and `step()` runs one full optimizer step
(all micro-batches) and returns what it measured. Timing, record writing and the progress bar live in
`bench.worker`, so every engine is measured the same way.

No torch import at module top: the launcher imports this module on login nodes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from muonbench.schema import RootConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class RankInfo:
    """Where this process sits (from torchrun's environment)."""

    rank: int
    """Global rank."""
    world_size: int
    local_rank: int
    """Rank on this node (picks the GPU)."""


@dataclass(kw_only=True, slots=True)
class StepMetrics:
    """One optimizer step as one rank measured it. Times are seconds; None = not measurable by this engine."""

    step_s: float
    """Wall time of the whole step (forward-backward of all micro-batches, grad sync, optimizer step)."""
    fwd_bwd_s: float
    """Forward + backward of all micro-batches."""
    optim_s: float
    """`optimizer.step()` (includes Newton-Schulz)."""
    ns_s: float | None
    """Time inside the orthogonalize calls (Newton-Schulz); 0 for AdamW."""
    comm_s: float | None
    """Gradient synchronisation time where it is a separate phase (None when overlapped/unknown)."""
    tokens: int
    """Tokens processed by all ranks in this step (global batch x sequence length)."""
    loss: float
    """Training loss of this rank's micro-batches (mean)."""
    peak_mem_bytes: int | None
    """Peak accelerator memory (GPU) or peak resident set size (CPU) of this rank."""
    ns_flops: float = 0.0
    """FLOPs of the Newton-Schulz calls this rank executed in this step (plain convention)."""
    extra: dict[str, float] = field(default_factory=dict)
    """Further per-step numbers by name (e.g. `cpu_s`, `adamw_s`, `grad_norm`): each an entry of `bench.metrics`."""


class Engine(ABC):
    """One training engine (hf, megatron, bridge). One instance per rank."""

    name: ClassVar[str]
    timer: str = "perf_counter"
    """How `step_s` is measured: `cuda_events` or `perf_counter` (wall) - printed in every report."""
    device: str = "cpu"
    """Device of this rank's collectives (`cuda:<local_rank>` with NCCL); engines set it in `setup`."""
    run_dir: str = ""
    """The run directory (set by the caller before `setup`), where probes write their files."""

    @abstractmethod
    def setup(self, cfg: RootConfig, rank: RankInfo) -> None:
        """Build model, data and optimizer for this rank (process group already initialised when world > 1)."""

    @abstractmethod
    def step(self) -> StepMetrics:
        """Run one optimizer step (all micro-batches of the global batch share) and return its measurements."""

    def skipped_updates(self) -> int | None:
        """Parameter updates this rank's optimizers of ours skipped so far (non-finite gradient or state under
        `nonfinite_policy=skip`); None where no optimizer of ours runs."""
        return None

    def describe(self) -> dict[str, Any]:
        """Facts for the run record (parameter counts, optimizer routing, timer), called after `setup`."""
        return {}

    @abstractmethod
    def teardown(self) -> None:
        """Free what `setup` built."""


def count_skipped_updates(optimizers: Any) -> int:
    """Skipped parameter updates of torch optimizers: their `num_skipped_updates` (a HybridOptimizer's counts its
    AdamW side and its parts), else their parts' (a dict of `optimizers`), else the length of their
    `nonfinite_events` log; 0 for optimizers without any."""
    total = 0
    for opt in optimizers:
        counter = getattr(opt, "num_skipped_updates", None)
        parts = getattr(opt, "optimizers", None)
        if counter is not None:
            total += int(counter)
        elif isinstance(parts, dict):
            total += count_skipped_updates(parts.values())
        else:
            total += len(getattr(opt, "nonfinite_events", ()))
    return total
