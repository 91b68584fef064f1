"""Metrics sinks: every step's numbers to TensorBoard, Weights & Biases or MLflow (`bench.logger`), rank 0 only.

The scalar names are Megatron-Bridge's training-log names (`megatron.bridge.training.utils.train_utils`), so a
dashboard shows our engines and Bridge's own loop under one tag; torchtitan's equivalents are listed in
docs/metrics.md. `steps.jsonl` stays the record; a sink is a view of it. Offline modes are the tools' own:
`WANDB_MODE=offline`, and MLflow writes to `<run_dir>/mlruns` unless `MLFLOW_TRACKING_URI` is set (`prepare`).

Imported by the worker (no torch at module top); the sink's package is imported when the sink opens, and the
warnings that import raises go to the run's log file, not the console.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Protocol

from bench import metrics
from bench.results import record
from muonbench.compose import LOGGER_EXTRAS


class Sink(Protocol):
    def log(self, scalars: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def scalars(row: dict[str, Any], *, model_flops_per_step: float | None, world_size: int) -> dict[str, float]:
    """The sink's scalars of one reduced step row (TF/s per GPU by `record.tflops_per_gpu`); unmeasured left out."""
    model_tf, ns_tf = record.tflops_per_gpu(
        step_s=row["step_s"],
        world_size=world_size,
        model_flops_per_step=model_flops_per_step,
        ns_flops=row.get("ns_flops") or 0.0,
    )
    values = {**row, "model_tflops_per_gpu": model_tf, "ns_tflops_per_gpu": ns_tf}
    return {name: float(values[key]) for key, name in metrics.sink_names().items() if values.get(key) is not None}


class _TensorBoard:
    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(tensorboard_dir(run_dir)))

    def log(self, scalars: dict[str, float], step: int) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, run_dir: Path, run_id: str, project: str, config: dict[str, Any]) -> None:
        import wandb

        self.wandb = wandb
        # The bridge engine's Bridge logger may already hold this process's run: log into it, on its own step.
        self.own = wandb.run is None
        if self.own:
            wandb.init(project=project, name=run_id, dir=str(run_dir), config=config)

    def log(self, scalars: dict[str, float], step: int) -> None:
        if self.own:
            self.wandb.log(scalars, step=step)
        else:
            self.wandb.log({f"muonbench/{k}": v for k, v in scalars.items()} | {"muonbench/step": step})

    def close(self) -> None:
        if self.own:
            self.wandb.finish()
            # The worker leaves by os._exit (no atexit hooks): stop W&B's service now, so the run file is complete.
            self.wandb.teardown()


class _MLflow:
    def __init__(self, run_dir: Path, run_id: str, project: str) -> None:
        prepare("mlflow")
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri())
        mlflow.set_experiment(project)
        self.run = mlflow.start_run(run_name=run_id, nested=mlflow.active_run() is not None)

    def log(self, scalars: dict[str, float], step: int) -> None:
        # MLflow metric names allow no spaces: Bridge's MLflow logger writes "lm loss" as "lm_loss" too.
        self.mlflow.log_metrics({k.replace(" ", "_"): v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def prepare(kind: str) -> None:
    """Process settings of `bench.logger=kind` that must precede any logger (Bridge's starts in the engine's setup):
    MLflow 3 refuses a file store unless MLFLOW_ALLOW_FILE_STORE=true, and `<run_dir>/mlruns` is the offline default."""
    if kind == "mlflow" and not os.environ.get("MLFLOW_TRACKING_URI"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def tensorboard_dir(run_dir: Path) -> Path:
    """Where `bench.logger=tensorboard` writes our events (Bridge's own loop writes into its `bridge/` folder)."""
    return run_dir / "tensorboard"


def open_sink(kind: str, run_dir: Path, *, run_id: str, project: str, config: dict[str, Any]) -> Sink | None:
    """The sink of `bench.logger=kind` (None for `none`); warnings of its import go to `<run_dir>/run.log`."""
    if kind == "none":
        return None
    if kind not in LOGGER_EXTRAS:
        raise ValueError(f"bench.logger={kind!r}: must be one of {['none', *LOGGER_EXTRAS]}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sink: Sink
        if kind == "tensorboard":
            sink = _TensorBoard(run_dir)
        elif kind == "wandb":
            sink = _WandB(run_dir, run_id, project, config)
        else:
            sink = _MLflow(run_dir, run_id, project)
    if caught:
        with open(run_dir / "run.log", "a") as f:
            f.writelines(f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}\n" for w in caught)
    return sink
