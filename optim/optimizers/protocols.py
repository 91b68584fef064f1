"""The narrow interfaces the parts of the Muon step see of each other, as `typing.Protocol`s.

The reference step (`orthogonalized`), the fused CUDA step (`fused`) and speculative NS (`speculative`) are composed
at construction (`muon`); each annotates the others with these views instead of importing their classes, so no
module imports a sibling for a type and the four stay free of import cycles.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from optim.configs import MuonConfig
from optim.functional.split import RowSplit

if TYPE_CHECKING:
    from optim.kernels.ns_batched import LastProduct
    from optim.optimizers.sharded import TPSharding

Orthogonalize = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]
"""(B, m, n) NS input -> (orthogonalized, per-matrix scale or None)."""


class MuonView(Protocol):
    """What the fused step and speculative NS read of their Muon (`optim.optimizers.muon.Muon`)."""

    config: MuonConfig
    param_groups: list[dict[str, Any]]
    state: Any
    """torch.optim.Optimizer's per-parameter state."""
    splits: dict[int, RowSplit]
    sharding: TPSharding | None

    def _orthogonalize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def _ns_deferred(self, x: torch.Tensor, sumsq: torch.Tensor) -> LastProduct | None: ...

    def _shape_scale(self, rows: int, cols: int) -> float: ...

    def _report_nonfinite(self, events: list[tuple[str, int, str]]) -> None: ...


class SpeculationView(Protocol):
    """The speculation's hook the reference step instruments (`optim.optimizers.speculative.Speculation`)."""

    orthogonalize: Orthogonalize | None
    confirmed: bool
    """The caller vouched that the gradients given to `speculate` are this step's (one-shot)."""
    stats: dict[str, int]

    def speculate(self, params: list[torch.Tensor], grads: list[torch.Tensor], *, stream: Any = None) -> None: ...

    def take(self) -> list[Any]: ...


class FusedStepView(Protocol):
    """What the reference step and speculative NS call on the fused step (`optim.optimizers.fused.FusedStep`)."""

    grads_known_finite: bool
    """The next step may skip the gradient screen (one-shot)."""
    packed_sumsq: torch.Tensor | None
    """The fused pack's squared norms of the stack being orthogonalized, while it is."""

    @property
    def opt(self) -> MuonView: ...

    @property
    def speculation(self) -> SpeculationView: ...

    def params(self) -> list[torch.Tensor]: ...

    def step(self, params: list[torch.Tensor]) -> None: ...

    def forget_buckets(self) -> None: ...

    def groups(self) -> dict[int, dict[str, Any]]: ...

    def pieces(self, p: torch.Tensor) -> int: ...

    def as_pieces(self, p: torch.Tensor, x: torch.Tensor) -> torch.Tensor: ...

    def apply_update(
        self, group: dict[str, Any], ps: list[torch.Tensor], orth: torch.Tensor, mscale: torch.Tensor | None
    ) -> None: ...
