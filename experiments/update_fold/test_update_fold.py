"""CPU checks of the argument parsing (the measurement needs CUDA and QuACK)."""

import pytest

from experiments.update_fold.fold import parse_param_shapes


def test_parse_param_shapes() -> None:
    assert parse_param_shapes("128x1536x2048, 1X16x8") == [(128, 1536, 2048), (1, 16, 8)]


@pytest.mark.parametrize("bad", ["128x1536", "0x8x16", "ax8x16"])
def test_parse_param_shapes_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="shapes"):
        parse_param_shapes(bad)
