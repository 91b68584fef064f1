"""Owner-aligned flat layout of one parameter domain (dense or expert) over the ranks of its data-parallel group.

Pure bookkeeping (no torch.distributed), identical on every rank because every input is.

A *piece* is a dim-0 range [start, stop) of one parameter. Matrices routed to the matrix optimizer are owned whole
(2-D), or expert by expert (3-D stacks: a piece is a contiguous range of experts); non-matrix (AdamW) parameters are
cut anywhere along dim 0, because AdamW is element-wise and a dim-0 cut keeps the name and the number of dims, so
routing (decay or not) is unchanged. Matrices go to ranks by the chosen `Strategy`; the AdamW parameters then fill
the ranks with the fewest elements first, which levels the per-rank segment sizes so that the padding of the
padded reduce-scatter / all-gather stays small.

Rank r's segment is the concatenation of its pieces; segments are padded to the largest, `segment_numel`, so the
domain's flat buffer is `num_ranks * segment_numel` long and rank r's segment starts at `r * segment_numel`.
Parameters are split into buckets (consecutive in model order, `bucket_numel` elements each; 0 = one bucket) so
that parameter all-gathers can complete bucket by bucket before the layers that need them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from optim.distributed.assignment import CostModel, Strategy, assign


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows [start, stop) along dim 0 of parameter `index`; `offset` is its start inside the rank's segment."""

    index: int
    start: int
    stop: int
    row_numel: int
    offset: int

    @property
    def numel(self) -> int:
        return (self.stop - self.start) * self.row_numel


@dataclass(slots=True)
class Bucket:
    """One flat buffer: per-rank pieces, padded segment size, and the parameters it covers."""

    params: list[int]
    pieces: list[list[Piece]]
    segment_numel: int = 0
    total_numel: int = 0

    @property
    def padding(self) -> float:
        """Extra elements of the padded buffer over the real ones, as a fraction."""
        n = len(self.pieces)
        return n * self.segment_numel / self.total_numel - 1.0 if self.total_numel else 0.0

    def sizes(self) -> list[int]:
        return [sum(p.numel for p in ps) for ps in self.pieces]


@dataclass(slots=True)
class DomainLayout:
    buckets: list[Bucket] = field(default_factory=list)


def build_layout(
    shapes: Sequence[Sequence[int]],
    is_matrix: Sequence[bool],
    num_ranks: int,
    *,
    strategy: Strategy | str,
    cost_model: CostModel | None = None,
    bucket_numel: int = 0,
    initial_loads: Sequence[float] | None = None,
) -> DomainLayout:
    """Layout of parameters with `shapes` (model order) over `num_ranks` ranks; see the module docstring.

    `initial_loads` (NS ms already on each rank, e.g. its expert matrices) is used by `lpt_cost` only.
    """
    numels = [_numel(s) for s in shapes]
    items: list[tuple[int, Sequence[int]]] = []  # (param index, matrix shape) per owned matrix
    for i, (s, mat) in enumerate(zip(shapes, is_matrix, strict=True)):
        if mat:
            if len(s) not in (2, 3):
                raise ValueError(f"parameter {i} of shape {tuple(s)}: a matrix must be 2-D or a 3-D stack")
            items += [(i, s[-2:])] * (s[0] if len(s) == 3 else 1)
    owners = assign(
        [m for _, m in items],
        num_ranks,
        strategy,
        cost_model=cost_model,
        initial_loads=initial_loads if Strategy(strategy) == Strategy.LPT_COST else None,
    )
    per_param: dict[int, list[int]] = {}
    for (i, _), r in zip(items, owners, strict=True):
        per_param.setdefault(i, [0] * num_ranks)[r] += 1
    layout = DomainLayout()
    for bucket_params in _bucket_params(numels, bucket_numel):
        raw: list[list[tuple[int, int, int, int]]] = [[] for _ in range(num_ranks)]
        sizes = [0] * num_ranks
        for i in bucket_params:
            if not is_matrix[i]:
                continue
            row = numels[i] // shapes[i][0]
            counts, start = per_param[i], 0
            for r, c in enumerate(
                counts
            ):  # contiguous expert ranges in rank order (load depends on counts only)
                if c:
                    stop = start + c if len(shapes[i]) == 3 else shapes[i][0]
                    raw[r].append((i, start, stop, row))
                    sizes[r] += (stop - start) * row
                    start = stop
        for i in bucket_params:
            if is_matrix[i] or numels[i] == 0:
                continue
            _fill(raw, sizes, i, shapes[i][0] if len(shapes[i]) else 1, numels[i])
        pieces = []
        for r in range(num_ranks):
            offset, mine = 0, []
            for i, a, b, row in sorted(raw[r]):
                mine.append(Piece(index=i, start=a, stop=b, row_numel=row, offset=offset))
                offset += (b - a) * row
            pieces.append(mine)
        layout.buckets.append(
            Bucket(
                params=list(bucket_params),
                pieces=pieces,
                segment_numel=max(sizes),
                total_numel=sum(numels[i] for i in bucket_params),
            )
        )
    return layout


def _fill(
    raw: list[list[tuple[int, int, int, int]]], sizes: list[int], index: int, rows: int, numel: int
) -> None:
    """Cut an element-wise parameter along dim 0: the emptiest ranks first, each rank at most one contiguous chunk
    (so a parameter name appears once per rank), each filled up to the level that evens out the segments."""
    row = numel // rows
    target = _water_level(sizes, numel)
    order = sorted(range(len(sizes)), key=lambda k: (sizes[k], k))
    start = 0
    for j, r in enumerate(order):
        if start >= rows:
            break
        deficit_rows = -(-max(0, target - sizes[r]) // row)
        take = rows - start if j == len(order) - 1 else min(rows - start, deficit_rows)
        if take:
            raw[r].append((index, start, start + take, row))
            sizes[r] += take * row
            start += take


def _water_level(sizes: Sequence[int], amount: int) -> int:
    """Smallest level L with sum(max(0, L - s)) >= amount: pouring `amount` onto the lowest segments first."""
    low = sorted(sizes)
    prefix = 0
    for k, s in enumerate(low, start=1):
        prefix += s
        cap = low[k] if k < len(low) else None
        if cap is None or cap * k - prefix >= amount:
            return -(-(amount + prefix) // k)
    raise AssertionError("unreachable")


def _bucket_params(numels: Sequence[int], bucket_numel: int) -> list[list[int]]:
    if bucket_numel <= 0:
        return [list(range(len(numels)))] if numels else []
    buckets: list[list[int]] = [[]]
    acc = 0
    for i, n in enumerate(numels):
        if buckets[-1] and acc + n > bucket_numel:
            buckets.append([])
            acc = 0
        buckets[-1].append(i)
        acc += n
    return buckets


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
