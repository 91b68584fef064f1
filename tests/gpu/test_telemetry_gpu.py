"""The NVML sampler on a real GPU: a step of matrix products reads a plausible SM clock, power and temperature."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_sampler_reads_the_gpu_under_load() -> None:
    pytest.importorskip("pynvml", reason="NVML comes from nvidia-ml-py")
    from bench import telemetry

    s = telemetry.open_for(torch.cuda.current_device(), interval_s=0.02)
    assert s is not None
    try:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        s.step()
        for _ in range(50):
            a = a @ a
            a = a / a.norm()
        torch.cuda.synchronize()
        step = s.step()
    finally:
        s.close()
    assert 500 < step["sm_mhz"] < 3000 and step["power_w"] > 50 and 10 < step["temp_c"] < 100
    assert set(step) == set(telemetry.KEYS)
