"""Tensor-parallel specs of Muon / MOP parameters: which dim is sharded, over which group, in which NS mode.

A parameter with a `TPSpec` is this rank's shard of a larger matrix; the optimizer orthogonalizes it with
`optim.distributed.tp_orthogonalize.tp_newton_schulz` and scales the update by the FULL matrix shape. `mode="auto"`
asks a callable `tp_mode_fn(rows, cols, tp, partition_dim) -> "duplicated" | "distributed" | ...` (full rows and
cols, TP size, 0 or 1) once per parameter, at its first step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from optim.configs import TP_MODE_CHOICES, TPMode
from optim.distributed.comm import group_rank_size
from optim.distributed.tp_orthogonalize import tp_newton_schulz

TPModeFn = Callable[[int, int, int, int], str]
"""(full rows, full cols, TP size, partition_dim in {0, 1}) -> a TPMode value."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TPSpec:
    """How one parameter is sharded over tensor parallelism.

    Attributes:
        partition_dim: sharded dim of the matrix: 0 (rows, column-parallel) or 1 (cols, row-parallel); -2 / -1
            are accepted. For 3-D (experts, out, in) stacks it counts from the matrix dims as well.
        group: the TP group (the expert-TP group for expert weights); None = one process.
        mode: a TPMode or "auto" (needs the optimizer's `tp_mode_fn`).
        shard_sizes: every rank's size along partition_dim (uneven splits); None = all equal to the local size.
    """

    partition_dim: int
    group: dist.ProcessGroup | None = None
    mode: TPMode | str = TPMode.DUPLICATED
    shard_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.partition_dim not in (0, 1, -2, -1):
            raise ValueError(f"partition_dim={self.partition_dim!r} is not one of (0, 1, -2, -1)")
        if self.mode not in TP_MODE_CHOICES:
            raise ValueError(f"mode={self.mode!r} is not one of {TP_MODE_CHOICES}")
        if self.shard_sizes is not None:
            sizes = tuple(int(s) for s in self.shard_sizes)
            if not sizes or min(sizes) < 1:
                raise ValueError(
                    f"shard_sizes={self.shard_sizes!r} must be a non-empty list of positive sizes"
                )
            object.__setattr__(self, "shard_sizes", sizes)

    @property
    def dim(self) -> int:
        """partition_dim as -2 (rows) or -1 (cols)."""
        return self.partition_dim - 2 if self.partition_dim >= 0 else self.partition_dim

    def size(self) -> int:
        """TP size (1 for group None or without torch.distributed)."""
        return group_rank_size(self.group)[1]

    def newton_schulz(
        self, x: torch.Tensor, *, mode: TPMode, shard_sizes: tuple[int, ...] | None, **ns: Any
    ) -> torch.Tensor:
        """`tp_newton_schulz` of the (B, r, c) shards `x` over this spec's group and dim in the resolved `mode`;
        `ns`: the optimizer's NS settings (num_ns_steps, coefficients, compute_dtype, eps, ...)."""
        return tp_newton_schulz(
            x, mode=mode, partition_dim=self.dim, tp_group=self.group, shard_sizes=shard_sizes, **ns
        )

    def full_shape(self, p: torch.Tensor) -> tuple[int, int]:
        """(rows, cols) of the whole (unsharded) matrix of which `p` holds one shard."""
        shape = [p.size(-2), p.size(-1)]
        k = self.dim + 2
        shape[k] = sum(self.shard_sizes) if self.shard_sizes is not None else shape[k] * self.size()
        return shape[0], shape[1]

    def check(self, p: torch.Tensor, name: str) -> None:
        """ValueError when `p` does not fit this spec (shard size of this rank, number of shards)."""
        if self.shard_sizes is None:
            return
        rank, size = group_rank_size(self.group)
        if len(self.shard_sizes) != size or self.shard_sizes[rank] != p.size(self.dim):
            raise ValueError(
                f"{name}: shard_sizes={self.shard_sizes} does not fit a shard of shape {tuple(p.shape)} on rank "
                f"{rank} of a TP group of size {size} (partition_dim={self.partition_dim})"
            )


def resolve_mode(spec: TPSpec, p: torch.Tensor, fn: TPModeFn | None, name: str) -> TPMode:
    """The mode `p` runs in: `spec.mode`, or `fn`'s choice for "auto"; a distributed mode on a matrix whose short
    dim is sharded becomes DUPLICATED (what `tp_newton_schulz` falls back to), so that records show what ran."""
    rows, cols = spec.full_shape(p)
    if spec.mode != "auto":
        mode = TPMode(spec.mode)
    elif fn is None:
        raise ValueError(f"{name}: TPSpec mode='auto' needs the optimizer's tp_mode_fn")
    else:
        choice = fn(rows, cols, spec.size(), spec.dim + 2)
        if choice not in TP_MODE_CHOICES or choice == "auto":
            raise ValueError(
                f"{name}: tp_mode_fn returned {choice!r}, not one of {tuple(m.value for m in TPMode)}"
            )
        mode = TPMode(choice)
    sharded, other = (rows, cols) if spec.dim == -2 else (cols, rows)
    if mode in (TPMode.DISTRIBUTED, TPMode.DISTRIBUTED_GRAM) and sharded < other and spec.size() > 1:
        return TPMode.DUPLICATED
    return mode
