"""experiments.quack_sym_tiles: its arguments (the measurement needs an SM90 GPU and quack-kernels)."""

from __future__ import annotations

import pytest


def test_arguments_parse_and_bad_ones_name_what_is_allowed() -> None:
    """Shapes and configs parse into integer tuples (QuACK's SM90 default first); bad keys and values raise."""
    from experiments.quack_sym_tiles.quack_sym_tiles import parse_args

    args = parse_args([])
    assert args["shapes"][0] == (128, 1536, 2048) and args["configs"][0] == (128, 256, 2, False)
    args = parse_args(["shapes=4x64x128", "configs=128x128x1x1", "out=x.json"])
    assert args == {"shapes": [(4, 64, 128)], "configs": [(128, 128, 1, True)], "out": "x.json"}
    with pytest.raises(ValueError, match="key in"):
        parse_args(["tiles=1"])
    with pytest.raises(ValueError, match="shapes='4x64'"):
        parse_args(["shapes=4x64"])
    with pytest.raises(ValueError, match="pingpong"):
        parse_args(["configs=128x128x1x2"])
