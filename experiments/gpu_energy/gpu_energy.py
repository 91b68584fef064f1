"""GPU energy and clock per step phase, read from NVML (probe `gpu_energy`: `bench.probes=[gpu_energy]`).

A power-capped GPU turns energy into time: at its cap, a phase that draws more power slows the phases after it
(the clock controller lowers the SM clock to hold the average). `EnergyMeter` reads the device's cumulative energy
counter (`nvmlDeviceGetTotalEnergyConsumption`, mJ), SM clock, power, temperature and clock-event reasons at phase
boundaries; `PhaseEnergy` turns consecutive readings into joules and mean watts per phase. The engine synchronises
the device before each reading, so a boundary is where the GPU work ends, not where the host is.

NVML comes from `nvidia-ml-py` (`import pynvml`), present wherever NVIDIA's driver tools are; torch does not need it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

# nvmlClocksEventReasons bits (nvml.h): the ones that lower the clock under load.
EVENT_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


@dataclass(frozen=True)
class Reading:
    """One NVML sample: cumulative energy (J; None where the GPU's counter is unavailable), SM clock (MHz), power
    (W), temperature (C), clock-event bits."""

    energy_j: float | None
    sm_mhz: float
    power_w: float
    temp_c: float
    reasons: int


def reasons_text(bits: int) -> str:
    """`sw_power_cap+hw_slowdown`-style names of the clock-lowering bits set in `bits` ('' when none)."""
    return "+".join(name for bit, name in EVENT_REASONS.items() if bits & bit)


class EnergyMeter:
    """NVML readings for the CUDA device `device_index` (mapped to NVML's numbering through its PCI bus id)."""

    def __init__(self, device_index: int, *, nvml: Any = None, bus_id: str | None = None) -> None:
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as e:
                raise ValueError(
                    "probe gpu_energy reads the GPU energy counter through NVML and needs the nvidia-ml-py "
                    "package (`import pynvml`); install it or drop the probe"
                ) from e
        self.nvml = nvml
        nvml.nvmlInit()
        if bus_id is None:
            import torch

            props = torch.cuda.get_device_properties(device_index)
            bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        self.handle = nvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        self.energy_unavailable = self._energy_unavailable()
        """Why the energy counter cannot be used on this GPU ('' when it can): NVML refuses it, or it reads 0
        (an H200 has been seen to: a cumulative counter of a GPU that has run is never 0, so 0 means no counter,
        and its phases would record 0 J)."""

    def _energy_unavailable(self) -> str:
        try:
            mj = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except Exception as e:  # noqa: BLE001 - NVMLError_NotSupported and kin: no counter on this GPU
            return f"NVML energy counter not readable on this GPU ({type(e).__name__}: {e})"
        return "NVML energy counter reads 0 on this GPU" if mj == 0 else ""

    def sm_mhz(self) -> float:
        """The current SM clock alone (one NVML call)."""
        return float(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))

    def read(self) -> Reading:
        n, h = self.nvml, self.handle
        try:
            reasons = int(n.nvmlDeviceGetCurrentClocksEventReasons(h))
        except AttributeError:  # drivers / bindings before the "event" naming
            reasons = int(n.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        return Reading(
            energy_j=None if self.energy_unavailable else n.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0,
            sm_mhz=float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            power_w=n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            temp_c=float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            reasons=reasons,
        )


MIN_WATTS_WINDOW_S = 0.1
"""Shortest phase given a mean power. NVML's energy counter advances in coarse ticks: on the H200, a ~10 ms optimizer
step of a tiny model read 0 J in one step and 1,538 W in another."""


class PhaseEnergy:
    """Joules and mean watts per phase of one step from readings taken at its boundaries.

    `mark(name)` closes the phase `name` that began at the previous mark (or `start()`); a GPU without a usable
    energy counter (`EnergyMeter.energy_unavailable`) gets `energy_available` 0 and no joules or watts, never 0 J;
    `sync` runs before every
    reading (the engine passes `torch.cuda.synchronize`), so the energy of queued GPU work lands in its phase. A phase
    shorter than `MIN_WATTS_WINDOW_S` gets no `watts_<name>` (the counter's tick, not the power), and a phase over
    which the counter did not advance gets no `energy_<name>_j`: it ran inside one tick, and 0 J would be false.
    """

    def __init__(
        self, read: Callable[[], Reading], sync: Callable[[], None], clock: Callable[[], float]
    ) -> None:
        self._read, self._sync, self._clock = read, sync, clock
        self._last: tuple[float, Reading] | None = None
        self.values: dict[str, float] = {}

    def start(self) -> None:
        self._sync()
        self.values = {}
        self._last = (self._clock(), self._read())

    def mark(self, name: str) -> None:
        if self._last is None:
            raise RuntimeError(f"PhaseEnergy.mark({name!r}) before start()")
        self._sync()
        t1, r1 = self._clock(), self._read()
        t0, r0 = self._last
        if r0.energy_j is None or r1.energy_j is None:  # no counter: no joules, never 0 J
            self.values["energy_available"] = 0.0
        else:
            joules = r1.energy_j - r0.energy_j
            seconds = max(t1 - t0, 1e-9)
            self.values["energy_available"] = 1.0
            if joules > 0:
                self.values[f"energy_{name}_j"] = joules
                if seconds >= MIN_WATTS_WINDOW_S:
                    self.values[f"watts_{name}"] = joules / seconds
        self.values[f"sm_mhz_end_{name}"] = r1.sm_mhz
        self.values[f"power_capped_end_{name}"] = float(bool(r1.reasons & 0x4))
        self._last = (t1, r1)


SMI_FIELDS = ("power.draw", "clocks.sm", "temperature.gpu")


def parse_smi(text: str) -> list[tuple[float, float, float]]:
    """(power W, SM clock MHz, temperature C) per line of `nvidia-smi --query-gpu=<SMI_FIELDS>
    --format=csv,noheader,nounits` output; lines that are not three numbers (e.g. "[N/A]") are skipped."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            power, mhz, temp = (float(p) for p in parts)
        except ValueError:
            continue
        out.append((power, mhz, temp))
    return out


class SmiSampler:
    """Power, SM clock and temperature polled by `nvidia-smi` in the background while the `with` block runs (one
    sample per `period_ms`); no nvidia-ml-py needed. Without nvidia-smi on the path, `samples` stays empty."""

    def __init__(self, period_ms: int = 100, device_index: int = 0) -> None:
        self.period_ms, self.device_index = period_ms, device_index
        self.samples: list[tuple[float, float, float]] = []
        self._proc: Any = None

    def __enter__(self) -> Self:
        import shutil
        import subprocess

        if shutil.which("nvidia-smi"):
            self._proc = subprocess.Popen(
                ["nvidia-smi", f"--id={self.device_index}", f"--query-gpu={','.join(SMI_FIELDS)}",
                 "--format=csv,noheader,nounits", "-lms", str(self.period_ms)],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self.samples = parse_smi(self._proc.communicate()[0])

    def medians(self) -> dict[str, float]:
        """Median power (W), SM clock (MHz) and temperature (C) of the samples; empty without samples."""
        import statistics

        if not self.samples:
            return {}
        cols = list(zip(*self.samples, strict=True))
        return {
            name: statistics.median(col)
            for name, col in zip(("power_w", "sm_mhz", "temp_c"), cols, strict=True)
        }


def energy_meter_or_none(device_index: int = 0) -> EnergyMeter | None:
    """An `EnergyMeter` when nvidia-ml-py and the device answer, else None (the caller goes without joules)."""
    try:
        return EnergyMeter(device_index)
    except Exception:  # noqa: BLE001 - no pynvml, no driver, or an NVML error: energy is optional there
        return None


@dataclass(frozen=True)
class CappedTimes:
    """`capped_blocks`' result: per function the median ms and joules per call over the kept blocks (joules None
    without NVML), and nvidia-smi's median power, SM clock and temperature during the blocks."""

    ms: dict[str, float]
    joules: dict[str, float | None]
    smi: dict[str, float]


def capped_blocks(
    fns: dict[str, Callable[[], object]],
    idle_ms: dict[str, float],
    *,
    block_ms: float,
    rounds: int,
    meter: EnergyMeter | None,
    device_index: int = 0,
) -> CappedTimes:
    """Time each function of `fns` at the GPU's power cap: blocks of back-to-back calls lasting about `block_ms`
    (calls per block from its `idle_ms`, at least 3), the functions rotated per round (`optim.kernels.timing.rotation`);
    round 0 brings the GPU to its cap and is not kept, then `rounds` rounds; per function the median over its blocks
    of the mean ms per call, and of the NVML joules per call where `meter` is given."""
    import statistics

    import torch

    from optim.kernels.timing import rotation

    names = [n for n in fns if n in idle_ms]
    ms: dict[str, list[float]] = {n: [] for n in names}
    joules: dict[str, list[float]] = {n: [] for n in names}
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    with SmiSampler(100, device_index) as smi:
        for r in range(rounds + 1):
            for n in rotation(names, r):
                calls = max(3, round(block_ms / max(idle_ms[n], 1e-3)))
                e0 = meter.read().energy_j if meter is not None else 0.0
                start.record()
                for _ in range(calls):
                    fns[n]()
                end.record()
                end.synchronize()
                if r:
                    ms[n].append(start.elapsed_time(end) / calls)
                    if meter is not None:
                        joules[n].append((meter.read().energy_j - e0) / calls)
    return CappedTimes(
        ms={n: statistics.median(v) for n, v in ms.items()},
        joules={n: statistics.median(v) if v else None for n, v in joules.items()},
        smi=smi.medians(),
    )
