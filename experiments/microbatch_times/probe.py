"""Probe `microbatch_times`: CUDA events at every micro-batch of a step (first micro-batches vs the rest).

`bench.probes=[microbatch_times]` writes steps.jsonl `mb_first_ms` / `mb_rest_ms` (the first 4 micro-batches after
the optimizer step vs the rest) and prints the per-micro-batch list each step; `microbatch_times:sm_clock=true`
also reads the SM clock (NVML) at each micro-batch (`mb_first_mhz` / `mb_rest_mhz`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from bench import probes
from experiments.gpu_energy.gpu_energy import EnergyMeter


class MicrobatchClock:
    """CUDA events at the start of every micro-batch's forward (wrapped `forward_step_func`) and at the end of the
    forward-backward: per-micro-batch times (forward + backward, in issue order), and optionally the SM clock read
    from the host at each start. `summary()` after the device synchronised; the first `first` micro-batches are
    averaged apart from the rest, to show an after-effect of the previous optimizer step."""

    def __init__(self, *, clock_mhz: Callable[[], float] | None = None, first: int = 4) -> None:
        self.clock_mhz, self.first = clock_mhz, first
        self.events: list[Any] = []
        self.mhz: list[float] = []

    def reset(self) -> None:
        self.events, self.mhz = [], []

    def _mark(self) -> None:
        import torch

        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self.events.append(ev)
        if self.clock_mhz is not None:
            self.mhz.append(self.clock_mhz())

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._mark()
            return fn(*args, **kwargs)

        return timed

    def end(self) -> None:
        """Close the last micro-batch (call right after the forward-backward)."""
        self._mark()

    def times_ms(self) -> list[float]:
        return [a.elapsed_time(b) for a, b in zip(self.events, self.events[1:])]

    def summary(self) -> dict[str, float]:
        ms = self.times_ms()
        k = min(self.first, len(ms) - 1)
        if k < 1:
            return {}
        out = {"mb_first_ms": sum(ms[:k]) / k, "mb_rest_ms": sum(ms[k:]) / len(ms[k:])}
        mhz = self.mhz[: len(ms)]
        if len(mhz) == len(ms):
            out |= {"mb_first_mhz": sum(mhz[:k]) / k, "mb_rest_mhz": sum(mhz[k:]) / len(mhz[k:])}
        return out


class Probe(probes.Probe):
    keys: ClassVar[tuple[str, ...]] = ("mb_first_ms", "mb_rest_ms", "mb_first_mhz", "mb_rest_mhz")

    def __init__(self, sm_clock: str = "false", first: str = "4") -> None:
        if sm_clock not in ("true", "false"):
            raise ValueError(f"microbatch_times sm_clock={sm_clock!r}: must be one of ['true', 'false']")
        self.sm_clock, self.first = sm_clock == "true", int(first)

    def setup(self, engine: Any) -> None:
        clock = None
        if self.sm_clock:
            clock = EnergyMeter(engine.device.index).sm_mhz
        self.clock = MicrobatchClock(clock_mhz=clock, first=self.first)

    def wrap_forward_step(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.clock.reset()
        return self.clock.wrap(fn)

    def mark(self, phase: str) -> None:
        if phase == "fwd_bwd":
            self.clock.end()

    def after_step(self) -> dict[str, float]:
        print("microbatch ms:", " ".join(f"{x:.1f}" for x in self.clock.times_ms()), flush=True)
        return self.clock.summary()
