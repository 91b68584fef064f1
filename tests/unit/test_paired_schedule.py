"""The paired triangular schedule of `optim.kernels._quack_paired` (plain Python; the kernel computes the same pairs):
every tile of the triangle once, two tiles of one tile column per cluster."""

from __future__ import annotations

import pytest

from optim.kernels import paired_schedule as schedule


@pytest.mark.parametrize("n", [1, 2, 3, 6, 12, 16, 56, 64, 65])
def test_every_tile_of_the_triangle_once(n):
    seen = schedule.cover(n)
    assert set(seen) == {(i, j) for i in range(n) for j in range(i + 1)}
    assert set(seen.values()) == {1}
    assert schedule.num_pairs(n) == -(-n * (n + 1) // 4)


def test_pairs_share_their_column_and_repeat_only_when_odd():
    for n in range(1, 70):
        repeats = [w for w in range(schedule.num_pairs(n)) if len(set(schedule.pair(w, n)[1:])) == 1]
        assert len(repeats) == (n * (n + 1) // 2) % 2, n
    assert schedule.pair(0, 12) == (0, 0, 1)
    assert schedule.pair(38, 12) == (11, 3, 1)  # the last leftover pair, in tile column 11
    with pytest.raises(ValueError, match="w=39"):
        schedule.pair(39, 12)
