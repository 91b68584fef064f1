"""Metrics sinks: a step row reaches TensorBoard under Bridge's names (grad norm, learning rate, tokens/s, MFU and
the warm-up flag beside them) and reads back with the config as hparams; a tiny CPU run logs every step to W&B
(offline) and MLflow (file store, Bridge's MLflow names, params from the config, the run summary at the end) and the
tools' own readers give back steps.jsonl; a missing extra is one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bench import metrics, sinks, worker
from bench.results import record
from muonbench import compose, load
from recipes.overrides import logger_fields
from tests.unit._run_fixtures import write_tiny_run

ROW = {"step_s": 0.5, "loss": 6.25, "optim_s": 0.02, "ns_flops": 3e12, "peak_mem_bytes": 2**30, "tokens": 64,
       "grad_norm": 1.5, "lr": 3e-4, "warmup": True}  # fmt: skip



def run_on_one_thread(run_dir: Path) -> None:
    """`worker.run` of a tiny run with torch on one thread (as the suite's other in-process runs)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        worker.run(run_dir)
    finally:
        torch.set_num_threads(threads)

def test_scalars_carry_loss_times_tflops_and_memory() -> None:
    got = sinks.scalars(ROW, model_flops_per_step=8e12, world_size=2, peak_tflops=16.0)
    assert got == {
        "lm loss": 6.25,
        "iteration-time": 0.5,
        "throughput/tflops/device": 8.0,  # 8e12 / 0.5 s / 2 GPUs
        "throughput/ns_tflops/device": 6.0,  # 3e12 / 0.5 s, one GPU's NS work
        "throughput/tokens_per_sec": 128.0,  # 64 tokens / 0.5 s
        "throughput/mfu": 0.5,  # 8 of 16 TF/s
        "optimizer-time": 0.02,
        "mem-max-allocated-bytes": float(2**30),
        "grad-norm": 1.5,
        "learning-rate": 3e-4,
        "warmup": 1.0,
    }
    unknown = sinks.scalars(ROW, model_flops_per_step=None, world_size=2)
    assert "throughput/tflops/device" not in unknown and "throughput/mfu" not in unknown


def test_mlflow_names_are_bridges() -> None:
    """Bridge's MLflow logger keeps spaces ("lm loss") and names TF/s per GPU `throughput/tflops_per_device`."""
    names = metrics.mlflow_names()
    assert names["loss"] == "lm loss" and names["model_tflops_per_gpu"] == "throughput/tflops_per_device"
    assert names["ns_tflops_per_gpu"] == "throughput/ns_tflops_device"
    assert metrics.mlflow_name("a/b/c d@e!") == "a/b_c d_at_e_"


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs the tensorboard extra")
def test_tensorboard_events_read_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = sinks.open_sink("tensorboard", tmp_path, run_id="r", project="p", config={})
    assert sink is not None
    for step in range(3):
        row = {**ROW, "loss": 6.0 - step}
        sink.log(sinks.scalars(row, model_flops_per_step=8e12, world_size=2, peak_tflops=16.0), step)
    sink.summary({"summary/step_s_median": 0.5})
    sink.close()
    acc = EventAccumulator(str(sinks.tensorboard_dir(tmp_path))).Reload()
    assert set(acc.Tags()["scalars"]) == set(metrics.sink_names().values()) | {"summary/step_s_median"}
    assert [(e.step, e.value) for e in acc.Scalars("lm loss")] == [(0, 6.0), (1, 5.0), (2, 4.0)]
    assert [e.value for e in acc.Scalars("throughput/tflops/device")] == [8.0] * 3


def tiny_run(run_dir: Path, logger: str) -> list[dict[str, float]]:
    """A 4-step AdamW run of the tiny Qwen3-MoE proxy in this process (the worker opens the sink as on a cluster);
    returns its steps.jsonl rows."""

    write_tiny_run(
        run_dir,
        "optimizer=adamw",
        "bench.steps=4",
        f"bench.out_dir={run_dir.parent}",
        f"bench.logger={logger}",
        "bench.logger_project=tiny",
        run_id=f"{logger}_run",
    )
    run_on_one_thread(run_dir)
    assert record.read_json(run_dir / "run.json")["status"] == "ok"
    steps = record.read_steps(run_dir)
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    return steps


def expected(steps: list[dict[str, float]], name: str) -> list[tuple[int, float]]:
    """(step, value) of one sink scalar over a run's steps.jsonl rows."""
    key = next(k for k, v in metrics.sink_names().items() if v == name)
    return [(int(s["step"]), float(s[key])) for s in steps]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="needs the wandb extra")
def test_wandb_offline_run_holds_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B in offline mode: the run file (`run-<id>.wandb`, read with wandb's own record reader) has the run's name,
    project and config and one history row per step equal to steps.jsonl."""
    import json

    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    for off in ("WANDB_DISABLE_GIT", "WANDB_DISABLE_CODE", "WANDB_X_DISABLE_STATS", "WANDB_X_DISABLE_MACHINE_INFO"):
        monkeypatch.setenv(off, "true")  # nothing the test reads; spares the service a second of work
    run_dir = tmp_path / "0_adamw"
    steps = tiny_run(run_dir, "wandb")

    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    store = datastore.DataStore()
    store.open_for_scan(str(path))
    runs, history = [], []
    while (data := store.scan_data()) is not None:
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            runs.append(rec.run)
        elif kind == "history":
            history.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item})
    store.close()
    (run,) = runs
    assert (run.display_name, run.project) == ("wandb_run", "tiny")
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["optimizer"]["name"] == "adamw" and config["bench"]["steps"] == 4
    for name in ("lm loss", "iteration-time", "optimizer-time", "grad-norm", "learning-rate"):
        assert [(h["_step"], h[name]) for h in history] == expected(steps, name), name
    assert all(h["throughput/tflops/device"] > 0 and h["throughput/tokens_per_sec"] > 0 for h in history)
    assert [h["warmup"] for h in history] == [1, 0, 0, 0]


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="needs the mlflow extra")
def test_mlflow_file_store_holds_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow with no tracking server: the file store under the run directory, read with MlflowClient, has one
    metric per scalar under Bridge's MLflow name whose history equals steps.jsonl step by step, the config as
    params and the run summary."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # unset, and restored after: the worker must allow it itself
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    run_dir = tmp_path / "0_adamw"
    steps = tiny_run(run_dir, "mlflow")

    client = MlflowClient(tracking_uri=f"file:{run_dir / 'mlruns'}")
    experiment = client.get_experiment_by_name("tiny")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "mlflow_run" and run.info.status == "FINISHED"
    step_names = set(metrics.mlflow_names().values()) - {"throughput/mfu"}  # the CPU has no peak
    assert {n for n in run.data.metrics if not n.startswith("summary/")} == step_names
    for name in ("lm loss", "iteration-time", "optimizer-time", "grad-norm", "learning-rate"):
        got = client.get_metric_history(run.info.run_id, name)
        assert sorted((m.step, m.value) for m in got) == expected(steps, name), name
    summary = record.read_json(run_dir / "run.json")["summary"]
    assert run.data.metrics["summary/step_s_median"] == summary["step_s_median"]
    assert run.data.params["optimizer.name"] == "adamw" and run.data.params["bench.steps"] == "4"


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


def test_every_optimizer_reports_grad_norm_and_lr(tmp_path: Path) -> None:
    """Muon's steps had no gradient norm (None every step) and no step had a learning rate."""
    run_dir = tmp_path / "0_muon"
    write_tiny_run(run_dir, "optimizer=muon", "bench.steps=2", f"bench.out_dir={tmp_path}", "optimizer.clip_grad=0")
    run_on_one_thread(run_dir)
    steps = record.read_steps(run_dir)
    assert all(s["grad_norm"] > 0 and s["lr"] is not None for s in steps)
