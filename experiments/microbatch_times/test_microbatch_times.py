"""Probe microbatch_times: per-micro-batch CUDA event times, first micro-batches apart from the rest."""

from __future__ import annotations

import pytest

from experiments.microbatch_times.probe import MicrobatchClock, Probe


class _Ev:
    def __init__(self, t_ms: float) -> None:
        self.t = t_ms

    def elapsed_time(self, other: _Ev) -> float:
        return other.t - self.t


def test_microbatch_clock_splits_first_from_rest() -> None:
    mb = MicrobatchClock(first=2)
    starts = [0.0, 300.0, 550.0, 750.0, 950.0, 1150.0]  # 5 micro-batches and the end mark
    mb.events = [_Ev(t) for t in starts]
    mb.mhz = [1600.0, 1700.0, 1900.0, 1900.0, 1900.0, 1950.0]
    assert mb.times_ms() == [300.0, 250.0, 200.0, 200.0, 200.0]
    s = mb.summary()
    assert s["mb_first_ms"] == 275.0 and s["mb_rest_ms"] == 200.0
    assert s["mb_first_mhz"] == 1650.0 and s["mb_rest_mhz"] == 1900.0
    mb.mhz = []  # no clock reader: times only
    assert set(mb.summary()) == {"mb_first_ms", "mb_rest_ms"}
    mb.events = mb.events[:1]
    assert mb.summary() == {}


def test_microbatch_clock_wrap_marks_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([1500.0, 1800.0])
    mb = MicrobatchClock(clock_mhz=lambda: next(clock))
    marks: list[int] = []
    monkeypatch.setattr(
        MicrobatchClock, "_mark", lambda self: (marks.append(1), self.mhz.append(self.clock_mhz()))
    )
    f = mb.wrap(lambda a, b=0: a + b)
    assert f(1, b=2) == 3 and f(4) == 4
    assert len(marks) == 2 and mb.mhz == [1500.0, 1800.0]


def test_probe_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="sm_clock='yes'"):
        Probe(sm_clock="yes")
