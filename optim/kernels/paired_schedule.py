"""The paired triangular schedule of `optim.kernels._quack_paired`, in plain Python (no GPU, no QuACK): the kernel's
tile scheduler computes the same pairs on the GPU.

A symmetric product C = A B^T (B = A, or C symmetric for another reason) needs one of each mirrored pair of its
n x n output tiles: n (n + 1) / 2 tiles of the lower triangle, diagonal included. A 2-CTA cluster whose CTAs share
a column tile c multicasts that column's operand panel to both, so each cluster takes two tiles (r0, c), (r1, c)
of one tile column, any two rows. `pair(w, n)` is cluster w's pair (c, r0, r1):

- regular pairs, columns in order: column j holds the tiles (j..n-1, j); its rows pair as (j, j+1), (j+2, j+3), ...;
  where n - j is odd the last row n - 1 is left over. The columns before j hold floor(n^2 / 4) - floor((n - j)^2 / 4)
  pairs, so w's column is n - k for the smallest k with floor(k^2 / 4) >= floor(n^2 / 4) - w.
- leftover pairs: the leftover tile (n - 1, j) of each column with n - j odd is computed as its mirror (j, n - 1),
  in tile column n - 1, where those tiles pair in turn; an odd count of them leaves one cluster whose second CTA
  repeats its first's tile (the same values written twice).

Every tile is computed once (or twice, identically, in that one cluster) and written with its mirror, as QuACK's
symmetric epilogue does; `cover` checks that.
"""

from __future__ import annotations

import math


def num_pairs(n: int) -> int:
    """Clusters of the paired schedule for n x n output tiles: ceil(n (n + 1) / 4)."""
    leftover = (n + 1) // 2  # columns j with n - j odd
    return n * n // 4 + (leftover + 1) // 2


def pair(w: int, n: int) -> tuple[int, int, int]:
    """(column, row0, row1) of cluster w in [0, num_pairs(n)); row0 == row1 in the one repeated cluster."""
    if not 0 <= w < num_pairs(n):
        raise ValueError(f"w={w} is not in [0, {num_pairs(n)}) for n={n}")
    regular = n * n // 4
    if w < regular:
        rest = regular - w
        k = math.ceil(
            2.0 * math.sqrt(rest)
        )  # the kernel computes this in fp32, then corrects by one either way
        if k * k // 4 < rest:
            k += 1
        if (k - 1) * (k - 1) // 4 >= rest:
            k -= 1
        j = n - k
        t = w - (regular - k * k // 4)
        return j, j + 2 * t, j + 2 * t + 1
    q = w - regular
    r0 = n - 1 - 4 * q
    r1 = r0 - 2
    return n - 1, r0, r1 if r1 >= 0 else r0


def cover(n: int) -> dict[tuple[int, int], int]:
    """How often each unordered tile pair {i, j} (i >= j) is computed by the schedule for n tiles per side,
    a repeated tile of the same cluster counted once."""
    seen: dict[tuple[int, int], int] = {}
    for w in range(num_pairs(n)):
        c, r0, r1 = pair(w, n)
        for r in {r0, r1}:
            key = (max(r, c), min(r, c))
            seen[key] = seen.get(key, 0) + 1
    return seen
