"""GPU telemetry per step, from NVML: SM and memory clocks, power, temperature and clock-lowering reasons.

A thread samples the run's GPU every `interval_s` (0.1 s: one core's 1% at most; NVML calls release the GIL);
`step()` returns the mean clocks and power, the highest temperature and the union of the clock-event reasons seen
since the last call (`throttled` when a thermal or hardware slowdown was among them), so a slow step can be told from
a throttled one (`docs/compare.md`). Without NVML (`import pynvml`, from
nvidia-ml-py) or without a GPU, `open_for` returns None and the steps carry no telemetry.
"""

from __future__ import annotations

import threading
from typing import Any

from bench import metrics
from bench.results.intervals import throttled

KEYS = metrics.of("telemetry")
"""The steps.jsonl fields this module fills (their entries in `bench.metrics`)."""


class Sampler:
    """NVML samples of one GPU on a daemon thread; `step()` summarises and resets them."""

    def __init__(self, nvml: Any, handle: Any, interval_s: float = 0.1) -> None:
        self.nvml, self.handle, self.interval_s = nvml, handle, interval_s
        self._lock = threading.Lock()
        self._samples: list[tuple[float, float, float, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="muonbench-telemetry", daemon=True)
        self._thread.start()

    def _sample(self) -> tuple[float, float, float, float, int]:
        n, h = self.nvml, self.handle
        return (
            float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
            n.nvmlDeviceGetPowerUsage(h) / 1e3,
            float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            int(n.nvmlDeviceGetCurrentClocksEventReasons(h)),
        )

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                s = self._sample()
            except Exception:  # noqa: BLE001, S112 - a failed read loses one sample, never the run
                continue
            with self._lock:
                self._samples.append(s)

    def step(self) -> dict[str, float | None]:
        """This step's telemetry (the samples since the last call; one fresh sample if the step was shorter than
        the interval)."""
        with self._lock:
            samples, self._samples = self._samples, []
        if not samples:
            try:
                samples = [self._sample()]
            except Exception:  # noqa: BLE001 - the same keys on every rank, or the reduction over ranks hangs
                return dict.fromkeys(KEYS)
        k = len(samples)
        reasons = 0
        for s in samples:
            reasons |= s[4]
        return {
            "sm_mhz": sum(s[0] for s in samples) / k,
            "mem_mhz": sum(s[1] for s in samples) / k,
            "power_w": sum(s[2] for s in samples) / k,
            "temp_c": max(s[3] for s in samples),
            "throttle_reasons": float(reasons),
            "throttled": float(throttled(reasons)),
        }

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


def open_for(device_index: int, interval_s: float = 0.1) -> Sampler | None:
    """A sampler of the CUDA device `device_index` (matched to NVML's numbering by PCI bus id), or None where NVML
    or the GPU is not there."""
    try:
        import pynvml as nvml
        import torch

        nvml.nvmlInit()
        p = torch.cuda.get_device_properties(device_index)
        handle = nvml.nvmlDeviceGetHandleByPciBusId(f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0")
    except Exception:  # noqa: BLE001 - no NVML, no driver, no GPU: the run goes on without telemetry
        return None
    return Sampler(nvml, handle, interval_s)
