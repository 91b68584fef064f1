"""Probe idle_before_step: arguments checked at load, zero seconds is a no-op (no CUDA needed)."""

from __future__ import annotations

import pytest

from bench import probes
from experiments.idle_before_step.probe import Probe


def test_arguments_parsed_and_checked() -> None:
    (p,) = probes.load(["idle_before_step:seconds=0.5,mode=gpu_spin"])
    assert isinstance(p, Probe) and (p.seconds, p.mode) == (0.5, "gpu_spin")
    with pytest.raises(ValueError, match="mode='nap'"):
        probes.load(["idle_before_step:mode=nap"])
    with pytest.raises(ValueError, match="seconds='-1'"):
        Probe(seconds="-1")
    with pytest.raises(ValueError, match="unexpected keyword"):
        probes.load(["idle_before_step:minutes=1"])


def test_zero_seconds_returns_at_once() -> None:
    Probe(seconds="0").before_step()  # no CUDA call: this CPU machine has no GPU
