"""Row-block splitting of fused weight matrices, and its inverse.

A fused weight (..., rows, cols) whose rows form `num_groups` repetitions of blocks with sizes
`sizes = (s_0, ..., s_k)` (rows = num_groups * sum(sizes)) is split into k + 1 pieces; piece j gathers block j of
every group: (..., num_groups * s_j, cols). Examples (Megatron layouts):

- linear_qkv under GQA: num_groups = query groups, sizes = (heads_per_group * d, d, d) -> Q, K, V, each whole.
- linear_fc1 with a gated unit: num_groups = 1, sizes = (ffn, ffn) -> gate, up.
- MLA linear_kv_down_proj: num_groups = 1, sizes = (kv_lora_rank, rope_dim) -> latent, rope.

Leading dimensions (e.g. experts, E x rows x cols) are kept, so each piece of a 3-D stack is again a stack.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True, slots=True)
class RowSplit:
    """Split rows into interleaved blocks; `merge(split(x)) == x` exactly."""

    num_groups: int
    """Repetitions of the block pattern along the rows."""
    sizes: tuple[int, ...]
    """Rows of each block inside one group."""
    labels: tuple[str, ...] = ()
    """Optional names of the pieces (q, k, v, gate, up, ...), for reports."""

    def __post_init__(self) -> None:
        if self.num_groups < 1 or not self.sizes or min(self.sizes) < 1:
            raise ValueError(
                f"RowSplit(num_groups={self.num_groups}, sizes={self.sizes}) needs positive values"
            )
        if self.labels and len(self.labels) != len(self.sizes):
            raise ValueError(f"labels={self.labels!r} must name each of the {len(self.sizes)} blocks")

    @property
    def rows(self) -> int:
        return self.num_groups * sum(self.sizes)

    def piece_shapes(self, shape: torch.Size | tuple[int, ...]) -> list[tuple[int, ...]]:
        """Shapes of the pieces of a tensor of `shape`."""
        return [(*shape[:-2], self.num_groups * s, shape[-1]) for s in self.sizes]

    def split(self, x: torch.Tensor) -> list[torch.Tensor]:
        """(..., rows, cols) -> pieces (..., num_groups * s_j, cols); copies unless num_groups == 1."""
        if x.size(-2) != self.rows:
            raise ValueError(f"tensor with {x.size(-2)} rows does not fit {self} ({self.rows} rows)")
        lead, cols = x.shape[:-2], x.size(-1)
        grouped = x.reshape(*lead, self.num_groups, sum(self.sizes), cols)
        blocks = torch.split(grouped, list(self.sizes), dim=-2)
        return [b.reshape(*lead, self.num_groups * s, cols) for b, s in zip(blocks, self.sizes, strict=True)]

    def merge(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        """Inverse of `split`."""
        lead, cols = pieces[0].shape[:-2], pieces[0].size(-1)
        grouped = [
            p.reshape(*lead, self.num_groups, s, cols) for p, s in zip(pieces, self.sizes, strict=True)
        ]
        return torch.cat(grouped, dim=-2).reshape(*lead, self.rows, cols)
