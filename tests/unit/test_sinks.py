"""Metrics sinks: a step row reaches TensorBoard under Bridge's names and reads back; a missing extra is one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bench import sinks
from muonbench import compose, load
from recipes.overrides import logger_fields

ROW = {"step_s": 0.5, "loss": 6.25, "optim_s": 0.02, "ns_flops": 3e12, "peak_mem_bytes": 2**30, "tokens": 64}


def test_scalars_carry_loss_times_tflops_and_memory() -> None:
    got = sinks.scalars(ROW, model_flops_per_step=8e12, world_size=2)
    assert got == {
        "lm loss": 6.25,
        "iteration-time": 0.5,
        "throughput/tflops/device": 8.0,  # 8e12 / 0.5 s / 2 GPUs
        "throughput/ns_tflops/device": 6.0,  # 3e12 / 0.5 s, one GPU's NS work
        "optimizer-time": 0.02,
        "mem-max-allocated-bytes": float(2**30),
    }
    assert "throughput/tflops/device" not in sinks.scalars(ROW, model_flops_per_step=None, world_size=2)


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs the tensorboard extra")
def test_tensorboard_events_read_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = sinks.open_sink("tensorboard", tmp_path, run_id="r", project="p", config={})
    assert sink is not None
    for step in range(3):
        sink.log(sinks.scalars({**ROW, "loss": 6.0 - step}, model_flops_per_step=8e12, world_size=2), step)
    sink.close()
    acc = EventAccumulator(str(sinks.tensorboard_dir(tmp_path))).Reload()
    assert set(acc.Tags()["scalars"]) == set(sinks.SCALARS.values())
    assert [(e.step, e.value) for e in acc.Scalars("lm loss")] == [(0, 6.0), (1, 5.0), (2, 4.0)]
    assert [e.value for e in acc.Scalars("throughput/tflops/device")] == [8.0] * 3


def test_a_missing_extra_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(compose.ConfigError, match=r"^bench.logger='wandb': needs the wandb extra: pip install "
                       r"'muonbench\[wandb\]'$"):  # fmt: skip
        compose.check_runnable(load(["bench.logger=wandb"]))
    with pytest.raises(compose.ConfigError, match=r"bench.logger='neptune': must be one of"):
        load(["bench.logger=neptune"])


def test_bridge_logger_follows_the_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = str(tmp_path / "3_muon")
    bench = load(["bench.logger=none"]).bench
    assert logger_fields(bench, run) == {"tensorboard_dir": None}
    tb = logger_fields(load(["bench.logger=tensorboard"]).bench, run)
    assert tb["tensorboard_dir"] == str(tmp_path / "3_muon" / "tensorboard" / "bridge")
    assert tb["log_throughput_to_tensorboard"] and tb["log_memory_to_tensorboard"]
    wb = logger_fields(load(["bench.logger=wandb", "bench.logger_project=mine"]).bench, run)
    assert (wb["wandb_project"], wb["wandb_exp_name"], wb["wandb_save_dir"]) == ("mine", "3_muon", run)
    ml = logger_fields(load(["bench.logger=mlflow"]).bench, run)
    assert ml["mlflow_tracking_uri"] == f"file:{tmp_path / '3_muon' / 'mlruns'}"
    assert logger_fields(load(["bench.logger=tensorboard"]).bench, "") == {"tensorboard_dir": None}
