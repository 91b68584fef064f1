"""Probe `idle_before_step`: the GPU rests before each step (after a sync, outside the timed step).

Separates an after-effect of the previous step (a clock held down by a power cap) from the step's own work:
`idle_before_step:seconds=0.3,mode=sleep` (host sleeps, GPU idle) or `mode=gpu_spin` (a low-power one-block spin
kernel holds the GPU busy while the host waits on it), i.e. which of host and GPU must rest to remove it.
"""

from __future__ import annotations

import time

from bench import probes

MODES = ("sleep", "gpu_spin")


def idle(seconds: float, mode: str) -> None:
    """Let the GPU (sleep: and the host) rest for `seconds`."""
    import torch

    if seconds <= 0:
        return
    torch.cuda.synchronize()
    if mode == "gpu_spin":  # one block spinning on the SM clock: the GPU stays busy at low power
        torch.cuda._sleep(int(seconds * 1.98e9))
        torch.cuda.synchronize()
    else:
        time.sleep(seconds)


class Probe(probes.Probe):
    def __init__(self, seconds: str = "0", mode: str = "sleep") -> None:
        if mode not in MODES:
            raise ValueError(f"idle_before_step mode={mode!r}: must be one of {list(MODES)}")
        self.seconds, self.mode = float(seconds), mode
        if self.seconds < 0:
            raise ValueError(f"idle_before_step seconds={seconds!r}: must be >= 0")

    def before_step(self) -> None:
        idle(self.seconds, self.mode)
