"""Per-step GPU telemetry (bench.telemetry): what one step's NVML samples reduce to. NVML needs a driver, so the
sampler reads a scripted stand-in of the five NVML calls here; tests/gpu/test_telemetry_gpu.py reads the real one."""

from __future__ import annotations

import threading

from bench import telemetry
from bench.results import intervals


class ScriptedNvml:  # NVML's own method names below
    """The NVML calls the sampler makes, answering from a list of (sm, mem, mW, temp, reasons) samples."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, samples: list[tuple[float, float, float, float, int]]) -> None:
        self.samples, self.i, self.lock, self.fail = samples, 0, threading.Lock(), False

    def _now(self):
        if self.fail:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return self.samples[min(self.i, len(self.samples) - 1)]

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self._now()[0 if kind == self.NVML_CLOCK_SM else 1]

    def nvmlDeviceGetPowerUsage(self, h):
        return self._now()[2]

    def nvmlDeviceGetTemperature(self, h, kind):
        return self._now()[3]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        s = self._now()
        self.i += 1
        return s[4]


def test_a_step_reduces_its_samples() -> None:
    nvml = ScriptedNvml([(1800, 2600, 650_000, 60, 0x4), (1900, 2600, 670_000, 62, 0x1)])
    s = telemetry.Sampler(nvml, handle=None, interval_s=3600)  # the thread never samples: step() reads once
    try:
        first = s.step()
        assert first["sm_mhz"] == 1800 and first["power_w"] == 650 and first["throttle_reasons"] == 0x4
        assert first["throttled"] == 0.0  # the software power cap is normal operation at full load
        with s._lock:
            s._samples = [s._sample(), (1700.0, 2600.0, 700.0, 85.0, 0x40)]
        second = s.step()
        assert second["sm_mhz"] == (1900 + 1700) / 2 and second["temp_c"] == 85
        assert second["throttle_reasons"] == 0x41 and second["throttled"] == 1.0
        nvml.fail = True
        assert s.step() == dict.fromkeys(telemetry.KEYS)  # the same keys on every rank, even when a read fails
    finally:
        s.close()


def test_throttled_means_a_thermal_or_hardware_slowdown() -> None:
    assert not intervals.throttled(0x4) and not intervals.throttled(None) and not intervals.throttled(0)
    assert all(intervals.throttled(bit) for bit in intervals.THROTTLE_BITS)
    assert intervals.throttled(0x4 | 0x20)
