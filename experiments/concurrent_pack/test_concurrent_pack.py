"""CPU checks of the argument parsing (the measurement needs CUDA and QuACK)."""

import pytest

from experiments.concurrent_pack.concurrent_pack import main, parse_frees


def test_parse_frees() -> None:
    assert parse_frees("0, 8,16", sms=132) == [0, 8, 16]


@pytest.mark.parametrize("bad", ["0,a", "-2", "0,0", "132"])
def test_parse_frees_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="free="):
        parse_frees(bad, sms=132)


def test_unknown_argument_is_rejected_before_cuda() -> None:
    with pytest.raises(ValueError, match=r"unknown arguments \['frees'\]"):
        main(["frees=0,8"])
