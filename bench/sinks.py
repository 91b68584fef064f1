"""Metrics sinks: every step's numbers to TensorBoard, Weights & Biases or MLflow (`bench.logger`), rank 0 only.

The scalar names are Megatron-Bridge's training-log names (`megatron.bridge.training.utils.train_utils`), so a
dashboard shows our engines and Bridge's own loop under one tag (MLflow gets Bridge's MLflow names,
`metrics.mlflow_names`); torchtitan's equivalents are listed in docs/metrics.md. `steps.jsonl` stays the record; a
sink is a view of it. At the start a sink gets the resolved config (MLflow params, TensorBoard hparams, W&B config);
at the end the run summary (`summary/<field>`: median step, TF/s, MFU, ...). Offline modes are the tools' own:
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

    def summary(self, summary: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def scalars(
    row: dict[str, Any], *, model_flops_per_step: float | None, world_size: int, peak_tflops: float = 0.0
) -> dict[str, float]:
    """The sink's scalars of one reduced step row (TF/s per GPU by `record.tflops_per_gpu`, MFU against
    `peak_tflops`, 0 = unknown); unmeasured left out."""
    model_tf, ns_tf = record.tflops_per_gpu(
        step_s=row["step_s"],
        world_size=world_size,
        model_flops_per_step=model_flops_per_step,
        ns_flops=row.get("ns_flops") or 0.0,
    )
    values = {
        **row,
        "model_tflops_per_gpu": model_tf,
        "ns_tflops_per_gpu": ns_tf,
        "tokens_per_s": row["tokens"] / row["step_s"] if row.get("tokens") else None,
        "mfu": model_tf / peak_tflops if model_tf is not None and peak_tflops > 0 else None,
    }
    return {name: float(values[key]) for key, name in metrics.sink_names().items() if values.get(key) is not None}


def summary_scalars(summary: dict[str, Any] | None) -> dict[str, float]:
    """The run summary's numbers as `summary/<field>` (None and non-numbers left out)."""
    return {
        f"summary/{k}": float(v)
        for k, v in (summary or {}).items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def params(config: dict[str, Any], prefix: str = "") -> dict[str, str | int | float | bool]:
    """The resolved config flattened to dotted keys (`optimizer.lr`), lists as text: MLflow params and
    TensorBoard hparams."""
    out: dict[str, str | int | float | bool] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= params(value, f"{name}.")
        elif isinstance(value, str | int | float | bool):
            out[name] = value
        else:
            out[name] = str(value)
    return out


class _TensorBoard:
    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(tensorboard_dir(run_dir)))
        self.hparams = params(config)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)

    def summary(self, summary: dict[str, float]) -> None:
        # hparams with the summary as their metrics, in the run's own folder (run_name=".")
        self.writer.add_hparams(self.hparams, summary, run_name=".")

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

    def summary(self, summary: dict[str, float]) -> None:
        prefix = "" if self.own else "muonbench/"
        self.wandb.run.summary.update({f"{prefix}{k}": v for k, v in summary.items()})

    def close(self) -> None:
        if self.own:
            self.wandb.finish()
            # The worker leaves by os._exit (no atexit hooks): stop W&B's service now, so the run file is complete.
            self.wandb.teardown()


class _MLflow:
    def __init__(self, run_dir: Path, run_id: str, project: str, config: dict[str, Any]) -> None:
        prepare("mlflow")
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri())
        mlflow.set_experiment(project)
        self.run = mlflow.start_run(run_name=run_id, nested=mlflow.active_run() is not None)
        mlflow.log_params(params(config))
        self.names = {metrics.METRICS[k].sink: v for k, v in metrics.mlflow_names().items()}

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics({self.names.get(k, metrics.mlflow_name(k)): v for k, v in scalars.items()}, step=step)

    def summary(self, summary: dict[str, float]) -> None:
        self.mlflow.log_metrics(summary)

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
            sink = _TensorBoard(run_dir, config)
        elif kind == "wandb":
            sink = _WandB(run_dir, run_id, project, config)
        else:
            sink = _MLflow(run_dir, run_id, project, config)
    if caught:
        with open(run_dir / "run.log", "a") as f:
            f.writelines(f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}\n" for w in caught)
    return sink
