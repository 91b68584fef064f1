"""Records say what ran: the GPU's name, UUIDs and the host's identity in run.json's hardware section, and the
backend of each NS plan entry."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.results import record


def test_hardware_records_gpu_uuid_and_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Localises a hardware section that names the GPU but not which one, or not which host."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "NVIDIA H200, 580.159.04, GPU-1234, 1650924060000"\n'
                   'echo "NVIDIA H200, 580.159.04, GPU-5678, [N/A]"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    hw = record.hardware_info()
    assert (hw["gpu_name"], hw["gpu_count"], hw["driver"]) == ("NVIDIA H200", 2, "580.159.04")
    assert hw["gpu_uuids"] == ["GPU-1234", "GPU-5678"]
    assert hw["gpu_serials"] == ["1650924060000"]
    if Path("/etc/machine-id").exists():
        assert len(hw["machine_id_sha256"]) == 16
        assert Path("/etc/machine-id").read_text().strip() not in str(hw)


@pytest.mark.parametrize(
    ("method", "backend"),
    [("plain_torch", "cuBLAS"), ("plain_torch+graph", "cuBLAS"), ("plain_sym_tma128", "Triton"),
     ("gram_sym_t64+graph", "Triton"), ("plain_quack_sym", "QuACK+cuBLAS"), ("plain_quack_all", "QuACK"),
     ("plain_quack_all_coop256x208_cl1x2", "QuACK"), ("gram_quack_all+graph", "QuACK")],
)
def test_plan_entry_backend(method: str, backend: str):
    """Localises a run record that cannot say whether QuACK ran: each plan entry's backend from its method."""
    from optim.kernels.plan import backend_of

    assert backend_of(method) == backend


def test_shipped_seeds_name_no_checkout_paths():
    """Localises a shipped NS plan seed that carries the absolute path of the checkout that measured it."""
    import re

    seeds = Path(__file__).resolve().parents[2] / "optim" / "kernels" / "plan_seeds"
    bad = [f.name for f in seeds.glob("*.json") if re.search(r'[="]/[^"]*/(?:reports|conf|tests)/', f.read_text())]
    assert not bad, bad


def test_repo_relative_cuts_the_checkout_prefix():
    from optim.kernels.plan_seed import repo_relative

    assert repo_relative("model=hf:/work/main/reports/byo/models/x") == "model=hf:reports/byo/models/x"
    assert repo_relative("bench.out_dir=/tmp/runs/byo/a") == "bench.out_dir=/tmp/runs/byo/a"  # where it wrote
    assert repo_relative("optimizer=muon") == "optimizer=muon"
