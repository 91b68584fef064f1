"""CPU checks of the argument parsing (the measurement needs CUDA)."""

import pytest

from experiments.ns_plan_hot.hot_plan import parse_shapes


def test_parse_shapes() -> None:
    assert parse_shapes("128x1536x2048, 1X8x16") == [(128, 1536, 2048), (1, 8, 16)]


@pytest.mark.parametrize("bad", ["128x1536", "0x8x16", "4x32x16", "ax8x16"])
def test_parse_shapes_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="shapes"):
        parse_shapes(bad)
