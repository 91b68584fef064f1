"""Which data-parallel rank owns which matrix: pure functions from shapes to ranks.

The layer-wise distributed optimizer gives every Muon-managed matrix one owner rank, which runs Newton-Schulz (NS)
on it alone; the step time is the slowest rank's. Three strategies, selectable by `Strategy`:

- `ROUND_ROBIN`: matrix i goes to rank i mod N, in the given (model) order. As the NVIDIA blog describes it.
- `PING_PONG_NUMEL`: Megatron-Core's legacy `LayerWiseDistributedOptimizer`: sort ascending by numel (stable), deal
  0..N-1, then N-1..0, and so on. Balances bytes, not NS time.
- `LPT_COST` (ours): longest-processing-time greedy on a `CostModel` of NS time. The model knows that same-shape
  matrices on one rank run as one batched call (one fixed launch cost per shape and rank, then a per-matrix cost),
  so the greedy prefers co-locating equal shapes. A measured per-shape table replaces the analytic model.

No torch, no torch.distributed: `bench.tools.balance` and the performance model call these from shapes alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from optim import cost

Shape = tuple[int, int]


class Strategy(StrEnum):
    """Assignment strategy of whole matrices to ranks."""

    ROUND_ROBIN = "round_robin"
    PING_PONG_NUMEL = "ping_pong_numel"
    LPT_COST = "lpt_cost"


def canonical(shape: Sequence[int]) -> Shape:
    """(short, long) side: NS transposes so the Gram is short x short, so m x n and n x m cost and batch alike."""
    rows, cols = int(shape[-2]), int(shape[-1])
    return (rows, cols) if rows <= cols else (cols, rows)


def ns_flops(shape: Sequence[int], num_ns_steps: int = 5) -> float:
    """Plain NS FLOPs of one matrix of this shape (`optim.cost.ns_flops`)."""
    return cost.ns_flops(*canonical(shape), num_ns_steps)


@dataclass(frozen=True, kw_only=True, slots=True)
class CostModel:
    """NS milliseconds of `count` same-shape matrices batched on one rank: `fixed_ms + count * per_matrix_ms`.

    Analytic default, fitted to the H200 measurements of docs/references.md#h200-baseline: a call costs a
    near-fixed `fixed_ms` below a short side of ~1000 (about 15 GEMM launches plus norm and casts), and the GEMM
    efficiency of the batched call grows with the short side m as m / (m + half_eff_dim) of `peak_tflops`.
    A measured table (`from_table`) overrides the model shape by shape.
    """

    fixed_ms: float = 0.3
    """Per batched NS call (per distinct shape on a rank)."""
    peak_tflops: float = cost.GEMM_CEILING_TFLOPS
    """Dense bf16 GEMM ceiling (measured H200, `optim.cost.GEMM_CEILING_TFLOPS`)."""
    half_eff_dim: float = 600.0
    """Short side at which the batched call reaches half of `peak_tflops`."""
    num_ns_steps: int = 5
    table: Mapping[Shape, tuple[float, float]] = field(default_factory=dict)
    """Measured (fixed_ms, per_matrix_ms) per canonical (short, long) shape; wins over the model."""

    def __post_init__(self) -> None:
        for name in ("fixed_ms", "peak_tflops", "half_eff_dim"):
            if getattr(self, name) < 0 or (name == "peak_tflops" and self.peak_tflops == 0):
                raise ValueError(f"CostModel.{name}={getattr(self, name)!r}: must be positive")
        if self.num_ns_steps < 1:
            raise ValueError(f"CostModel.num_ns_steps={self.num_ns_steps!r}: must be >= 1")

    def terms(self, shape: Sequence[int]) -> tuple[float, float]:
        """(fixed_ms, per_matrix_ms) of one shape."""
        key = canonical(shape)
        if key in self.table:
            return self.table[key]
        m = key[0]
        rate = self.peak_tflops * 1e12 * m / (m + self.half_eff_dim)
        return self.fixed_ms, ns_flops(key, self.num_ns_steps) / rate * 1e3

    def group_ms(self, shape: Sequence[int], count: int) -> float:
        """Milliseconds of `count` same-shape matrices as one batched call (0 for count 0)."""
        if count <= 0:
            return 0.0
        fixed, per = self.terms(shape)
        return fixed + count * per

    @classmethod
    def from_table(cls, path: str | Path, **kwargs: float) -> CostModel:
        """Load a measured table: JSON list of {"rows", "cols", "fixed_ms", "per_matrix_ms"}.

        Shapes missing from the table fall back to the analytic model.
        """
        rows = json.loads(Path(path).read_text())
        table: dict[Shape, tuple[float, float]] = {}
        for i, row in enumerate(rows):
            missing = {"rows", "cols", "fixed_ms", "per_matrix_ms"} - set(row)
            if missing:
                raise ValueError(f"{path}: entry {i} lacks {sorted(missing)}")
            table[canonical((row["rows"], row["cols"]))] = (
                float(row["fixed_ms"]),
                float(row["per_matrix_ms"]),
            )
        return cls(table=table, **kwargs)  # type: ignore[arg-type]


def round_robin(shapes: Sequence[Sequence[int]], num_ranks: int) -> list[int]:
    """Matrix i -> rank i mod num_ranks, in the given order."""
    return [i % num_ranks for i in range(len(shapes))]


def ping_pong_numel(shapes: Sequence[Sequence[int]], num_ranks: int) -> list[int]:
    """Megatron-Core legacy: stable ascending sort by numel, dealt 0..N-1, N-1..0, 0..N-1, ..."""
    order = sorted(range(len(shapes)), key=lambda i: shapes[i][-2] * shapes[i][-1])
    owners = [0] * len(shapes)
    for pos, i in enumerate(order):
        lap, k = divmod(pos, num_ranks)
        owners[i] = k if lap % 2 == 0 else num_ranks - 1 - k
    return owners


def lpt_cost(
    shapes: Sequence[Sequence[int]],
    num_ranks: int,
    *,
    cost_model: CostModel | None = None,
    initial_loads: Sequence[float] | None = None,
) -> list[int]:
    """Longest-processing-time greedy on batched NS cost.

    Matrices are visited by decreasing standalone cost (ties: larger shape groups first, then model order). Each goes
    to the rank whose load after adding it is smallest, where adding a shape the rank already holds costs only
    `per_matrix_ms` (it joins that rank's batched call) and a new shape also pays `fixed_ms`. Ties go to the lowest
    rank, so the result is deterministic and identical on every rank. If the round-robin or ping-pong deal has a
    smaller maximum load (possible when counts divide evenly), that deal is returned instead, so lpt_cost is never
    worse than the published strategies under the same cost model.

    Args:
        shapes: (rows, cols) of each matrix.
        num_ranks: Ranks of the group.
        cost_model: NS cost; default `CostModel()`.
        initial_loads: Milliseconds already on each rank (e.g. its expert matrices when dense ones are placed
            second), length num_ranks.

    Returns:
        Owner rank per matrix, in input order.
    """
    model = cost_model or CostModel()
    loads = list(initial_loads) if initial_loads is not None else [0.0] * num_ranks
    if len(loads) != num_ranks:
        raise ValueError(f"initial_loads has {len(loads)} entries: must equal num_ranks={num_ranks}")
    keys = [canonical(s) for s in shapes]
    terms = {k: model.terms(k) for k in set(keys)}
    group_size: dict[Shape, int] = {}
    for k in keys:
        group_size[k] = group_size.get(k, 0) + 1
    order = sorted(range(len(shapes)), key=lambda i: (-sum(terms[keys[i]]), -group_size[keys[i]], i))
    held: list[set[Shape]] = [set() for _ in range(num_ranks)]
    owners = [0] * len(shapes)
    base = list(loads)
    for i in order:
        k = keys[i]
        fixed, per = terms[k]
        best, best_load = 0, float("inf")
        for r in range(num_ranks):
            new_load = loads[r] + per + (0.0 if k in held[r] else fixed)
            if new_load < best_load:
                best, best_load = r, new_load
        owners[i] = best
        loads[best] = best_load
        held[best].add(k)
    # Greedy LPT can lose to a regular deal when counts divide evenly (the deal then gives every rank the same
    # multiset of shapes); keep whichever placement has the smallest maximum load, LPT on ties.
    best_owners, best_max = owners, max(loads)
    for cand in (round_robin(shapes, num_ranks), ping_pong_numel(shapes, num_ranks)):
        cand_max = max(
            b + x for b, x in zip(base, rank_loads(shapes, cand, num_ranks, cost_model=model), strict=True)
        )
        if cand_max < best_max * (1 - 1e-12):
            best_owners, best_max = cand, cand_max
    return best_owners


def assign(
    shapes: Sequence[Sequence[int]],
    num_ranks: int,
    strategy: Strategy | str,
    *,
    cost_model: CostModel | None = None,
    initial_loads: Sequence[float] | None = None,
) -> list[int]:
    """Owner rank of each matrix under `strategy` (see the module docstring)."""
    if num_ranks < 1:
        raise ValueError(f"num_ranks={num_ranks!r}: must be >= 1")
    try:
        strategy = Strategy(strategy)
    except ValueError:
        raise ValueError(f"strategy={strategy!r}: must be one of {[s.value for s in Strategy]}") from None
    match strategy:
        case Strategy.ROUND_ROBIN:
            return round_robin(shapes, num_ranks)
        case Strategy.PING_PONG_NUMEL:
            return ping_pong_numel(shapes, num_ranks)
        case Strategy.LPT_COST:
            return lpt_cost(shapes, num_ranks, cost_model=cost_model, initial_loads=initial_loads)


def rank_loads(
    shapes: Sequence[Sequence[int]],
    owners: Sequence[int],
    num_ranks: int,
    *,
    cost_model: CostModel | None = None,
) -> list[float]:
    """NS milliseconds per rank: for each rank, sum over its distinct shapes of the batched `group_ms`."""
    model = cost_model or CostModel()
    counts: list[dict[Shape, int]] = [{} for _ in range(num_ranks)]
    for shape, r in zip(shapes, owners, strict=True):
        k = canonical(shape)
        counts[r][k] = counts[r].get(k, 0) + 1
    return [sum(model.group_ms(k, c) for k, c in per_rank.items()) for per_rank in counts]


def imbalance(loads: Sequence[float]) -> float:
    """max / mean of per-rank loads (1.0 = perfect; 1.0 for an all-zero load)."""
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean > 0 else 1.0
