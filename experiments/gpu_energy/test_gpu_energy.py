"""experiments.gpu_energy.gpu_energy: joules / watts per phase from NVML readings (fake NVML and clock here; real on the device)."""

from __future__ import annotations

import types

import pytest

from experiments.gpu_energy.gpu_energy import EnergyMeter, PhaseEnergy, Reading, reasons_text


def _fake_nvml(energy_mj: list[int], *, throttle_only: bool = False) -> types.SimpleNamespace:
    calls = {"init": 0, "bus": None}

    def init() -> None:
        calls["init"] += 1

    def handle(bus: str) -> str:
        calls["bus"] = bus
        return "h0"

    nvml = types.SimpleNamespace(
        calls=calls,
        NVML_CLOCK_SM=1,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=init,
        nvmlDeviceGetHandleByPciBusId=handle,
        nvmlDeviceGetTotalEnergyConsumption=lambda h: energy_mj.pop(0),
        nvmlDeviceGetClockInfo=lambda h, kind: 1830 if kind == 1 else 0,
        nvmlDeviceGetPowerUsage=lambda h: 675_500,
        nvmlDeviceGetTemperature=lambda h, kind: 54,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x4,
    )
    if not throttle_only:
        nvml.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4 | 0x40
    return nvml


def test_meter_reads_units_and_falls_back_to_throttle_reasons() -> None:
    nvml = _fake_nvml([1_999_000, 2_000_500, 2_001_500])  # the first: the meter's check of the counter
    m = EnergyMeter(0, nvml=nvml, bus_id="00000000:19:00.0")
    r = m.read()
    assert nvml.calls == {"init": 1, "bus": "00000000:19:00.0"}
    assert r == Reading(energy_j=2000.5, sm_mhz=1830.0, power_w=675.5, temp_c=54.0, reasons=0x44)
    assert reasons_text(r.reasons) == "sw_power_cap+hw_thermal"
    old = EnergyMeter(0, nvml=_fake_nvml([7, 7], throttle_only=True), bus_id="x").read()
    assert old.reasons == 0x4 and reasons_text(0) == ""


def test_phase_energy_splits_joules_and_watts_per_phase() -> None:
    energies = iter([100.0, 1500.0, 1600.0])
    times = iter([10.0, 12.0, 12.25])
    syncs: list[int] = []

    def read() -> Reading:
        return Reading(energy_j=next(energies), sm_mhz=1800.0, power_w=600.0, temp_c=50.0, reasons=0x4)

    pe = PhaseEnergy(read, lambda: syncs.append(1), lambda: next(times))
    with pytest.raises(RuntimeError, match="before start"):
        pe.mark("fwd_bwd")
    pe.start()
    pe.mark("fwd_bwd")
    pe.mark("optim")
    assert len(syncs) == 3  # every reading waits for the queued GPU work
    v = pe.values
    assert v["energy_fwd_bwd_j"] == pytest.approx(1400.0) and v["watts_fwd_bwd"] == pytest.approx(700.0)
    assert v["energy_optim_j"] == pytest.approx(100.0) and v["watts_optim"] == pytest.approx(400.0)
    assert v["power_capped_end_optim"] == 1.0 and v["sm_mhz_end_fwd_bwd"] == 1800.0
    # a phase shorter than MIN_WATTS_WINDOW_S keeps its joules but gets no mean power
    ticks = iter([12.0, 13.5])
    pe = PhaseEnergy(lambda: Reading(next(ticks), 1800.0, 600.0, 50.0, 0), lambda: None, iter([0.0, 0.05]).__next__)
    pe.start()
    pe.mark("optim")
    assert pe.values["energy_optim_j"] == pytest.approx(1.5) and "watts_optim" not in pe.values
    # a phase inside one tick of the counter (it did not advance) gets no joules: not 0 J, which would be false
    still = Reading(energy_j=12.0, sm_mhz=1800.0, power_w=600.0, temp_c=50.0, reasons=0)
    pe = PhaseEnergy(lambda: still, lambda: None, iter([0.0, 0.3]).__next__)
    pe.start()
    pe.mark("fwd_bwd")
    assert pe.values["energy_available"] == 1.0
    assert "energy_fwd_bwd_j" not in pe.values and "watts_fwd_bwd" not in pe.values


@pytest.mark.parametrize("counter", ["zero", "not supported"])
def test_an_unavailable_energy_counter_is_recorded_unavailable_not_zero_joules(counter: str) -> None:
    """An H200 whose NVML energy counter reads 0 recorded 0 J per phase (and the GPU test failed on its sum): the
    meter says why the counter is unusable and the phases get `energy_available` 0 and no joules or watts."""
    nvml = _fake_nvml([0, 0, 0, 0])
    if counter == "not supported":

        def refuse(h: str) -> int:
            raise RuntimeError("Not Supported")  # NVMLError_NotSupported in pynvml

        nvml.nvmlDeviceGetTotalEnergyConsumption = refuse
    m = EnergyMeter(0, nvml=nvml, bus_id="x")
    assert m.energy_unavailable == (
        "NVML energy counter reads 0 on this GPU"
        if counter == "zero"
        else "NVML energy counter not readable on this GPU (RuntimeError: Not Supported)"
    )
    assert m.read().energy_j is None and m.read().sm_mhz == 1830.0
    pe = PhaseEnergy(m.read, lambda: None, iter([0.0, 1.0, 2.0]).__next__)
    pe.start()
    pe.mark("fwd_bwd")
    pe.mark("optim")
    assert pe.values == {
        "energy_available": 0.0,
        "sm_mhz_end_fwd_bwd": 1830.0,
        "power_capped_end_fwd_bwd": 1.0,
        "sm_mhz_end_optim": 1830.0,
        "power_capped_end_optim": 1.0,
    }


def test_meter_without_pynvml_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name: str, *args: object, **kwargs: object) -> object:
        if name == "pynvml":
            raise ImportError("no pynvml")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    with pytest.raises(ValueError, match="gpu_energy reads .* nvidia-ml-py"):
        EnergyMeter(0)


def test_step_log_keeps_diagnostics_only_when_measured(tmp_path) -> None:
    import json

    from bench import metrics, probes
    from bench.results import record

    log = record.StepLog(tmp_path, extra_keys=probes.keys(["gpu_energy", "microbatch_times"]))
    base = {k: None for k in metrics.step_keys()} | {"step": 0}
    log.write(base)
    log.write(base | {"step": 1, "energy_fwd_bwd_j": 13800.5, "mb_first_ms": 260.0})
    with pytest.raises(AssertionError, match="outside the vocabulary"):
        log.write(base | {"temp_c_end_optim": 55.0})
    log.close()
    rows = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert set(rows[0]) == set(metrics.step_keys())
    assert rows[1]["energy_fwd_bwd_j"] == 13800.5 and rows[1]["mb_first_ms"] == 260.0
    assert "watts_optim" not in rows[1]


def test_probe_keys_cover_what_phase_energy_writes() -> None:
    """The probe's declared steps.jsonl keys are exactly what PhaseEnergy produces for the engine's two phases
    (a key missing from the declaration would make the step log reject the step)."""
    from experiments.gpu_energy.gpu_energy import PhaseEnergy, Reading
    from experiments.gpu_energy.probe import Probe

    readings = iter(
        Reading(energy_j=e, sm_mhz=1900.0, power_w=600.0, temp_c=50.0, reasons=0) for e in (0, 8, 10)
    )
    clock = iter((0.0, 1.0, 2.0))  # phases longer than MIN_WATTS_WINDOW_S: watts written too
    pe = PhaseEnergy(lambda: next(readings), lambda: None, lambda: next(clock))
    pe.start()
    pe.mark("fwd_bwd")
    pe.mark("optim")
    assert set(pe.values) | {"t_wall"} == set(Probe.keys)


def test_parse_smi_reads_numbers_and_skips_the_rest() -> None:
    from experiments.gpu_energy.gpu_energy import parse_smi

    text = "683.12, 1425, 54\n[N/A], 1980, 40\n690.0, 1365, 55\n"
    assert parse_smi(text) == [(683.12, 1425.0, 54.0), (690.0, 1365.0, 55.0)]


def test_smi_sampler_without_nvidia_smi_has_no_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from experiments.gpu_energy.gpu_energy import SmiSampler

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with SmiSampler() as smi:
        pass
    assert smi.samples == [] and smi.medians() == {}
