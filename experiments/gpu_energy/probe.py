"""Probe `gpu_energy`: NVML joules, mean watts, SM clock and power-cap state per step phase."""

from __future__ import annotations

import time
from typing import Any, ClassVar

from bench import probes
from experiments.gpu_energy.gpu_energy import EnergyMeter, PhaseEnergy

PHASES = ("fwd_bwd", "optim")


class Probe(probes.Probe):
    """Reads the GPU's energy counter at the start of a step and at the end of each phase. Adds a device sync
    between forward-backward and the optimizer step (inside the timed step)."""

    keys: ClassVar[tuple[str, ...]] = (
        "t_wall",
        "energy_available",
        *(
            k
            for ph in PHASES
            for k in (f"energy_{ph}_j", f"watts_{ph}", f"sm_mhz_end_{ph}", f"power_capped_end_{ph}")
        ),
    )

    def setup(self, engine: Any) -> None:
        import torch

        self.meter = EnergyMeter(engine.device.index)
        self.energy = PhaseEnergy(self.meter.read, torch.cuda.synchronize, time.perf_counter)
        self.t_wall = 0.0

    def before_step(self) -> None:
        self.t_wall = time.time()
        self.energy.start()

    def mark(self, phase: str) -> None:
        self.energy.mark(phase)

    def after_step(self) -> dict[str, float]:
        return {"t_wall": self.t_wall, **self.energy.values}
