"""The script's arguments and config names (its GPU path is the measurement itself: one SM90 GPU with QuACK)."""

from __future__ import annotations

import pytest


def test_arguments():
    from experiments.quack_apply_configs.apply_configs import parse_args

    args = parse_args(["shapes=2x256x512", "swap=0", "top=3"])
    assert args["shapes"] == [(2, 256, 512)] and args["swap"] is False and args["top"] == 3
    with pytest.raises(ValueError, match="unknown arguments"):
        parse_args(["shape=2x256x512"])
    with pytest.raises(ValueError, match="swap='2'"):
        parse_args(["swap=2"])
    with pytest.raises(ValueError, match="top=0"):
        parse_args(["top=0"])


def test_config_names_match_the_product_configs():
    from experiments.quack_apply_configs.apply_configs import config_name
    from optim.kernels.sym_quack import GENERAL_CONFIGS

    for name, c in GENERAL_CONFIGS.items():
        assert config_name(c.tile_m, c.tile_n, c.pingpong, c.cluster_m, c.cluster_n, False) == name
    assert config_name(128, 192, True, 2, 1, True) == "pp128x192_cl2x1_swap"
