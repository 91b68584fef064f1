"""Owner-aligned flat layout: pieces partition every parameter, matrices stay whole, segments are levelled."""

from __future__ import annotations

from itertools import pairwise

import pytest

from optim.distributed.layout import build_layout

SHAPES = [(13, 8), (21, 16), (16,), (3, 16), (7, 21, 16), (5, 16, 11), (21, 16), (16,), (13, 8)]
MATRIX = [False, True, False, True, True, True, True, False, False]


@pytest.mark.parametrize("num_ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("strategy", ["round_robin", "ping_pong_numel", "lpt_cost"])
@pytest.mark.parametrize("bucket_numel", [0, 400])
def test_pieces_partition_parameters(num_ranks: int, strategy: str, bucket_numel: int) -> None:
    """Localises overlapping or missing rows, split matrices, several pieces of one parameter on one rank
    (which would collide by name in the inner optimizer) and offsets past the segment."""
    layout = build_layout(SHAPES, MATRIX, num_ranks, strategy=strategy, bucket_numel=bucket_numel)
    covered: dict[int, list[tuple[int, int]]] = {}
    for b in layout.buckets:
        assert len(b.pieces) == num_ranks
        for pieces in b.pieces:
            assert len({p.index for p in pieces}) == len(pieces)
            end = 0
            for p in pieces:
                assert p.offset == end
                end += p.numel
                covered.setdefault(p.index, []).append((p.start, p.stop))
                assert p.index in b.params
            assert end <= b.segment_numel
        assert b.segment_numel == max(b.sizes())
    for i, shape in enumerate(SHAPES):
        ranges = sorted(covered[i])
        assert ranges[0][0] == 0 and ranges[-1][1] == shape[0]
        assert all(a[1] == b[0] for a, b in pairwise(ranges))
        if MATRIX[i] and len(shape) == 2:
            assert ranges == [(0, shape[0])]


def test_adamw_rows_level_the_segments() -> None:
    layout = build_layout([(64, 64), (100, 16)], [True, False], 4, strategy="lpt_cost")
    sizes = layout.buckets[0].sizes()
    assert sizes[0] == 4096 and max(sizes[1:]) - min(sizes[1:]) <= 2 * 16  # matrix whole; rows level the rest
    even = build_layout([(400, 4)], [False], 4, strategy="round_robin")
    assert even.buckets[0].sizes() == [400, 400, 400, 400] and even.buckets[0].padding == 0.0


def test_buckets_follow_model_order() -> None:
    layout = build_layout(SHAPES, MATRIX, 2, strategy="lpt_cost", bucket_numel=400)
    order = [i for b in layout.buckets for i in b.params]
    assert order == list(range(len(SHAPES))) and len(layout.buckets) > 1
