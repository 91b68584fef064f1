"""The step-metric registry: one entry per field of a `steps.jsonl` line, read by every consumer.

The engines fill the entries (a `StepMetrics` field, or a key of its `extra`), the worker reduces them over ranks,
the run record writes them (`record.StepLog`: the `always` ones on every line, `None` where unmeasured; the others
only when measured), the summary takes their medians, the sinks log them under their dashboard names and the
regression check compares their summary columns. Two per-step rates derived from them (model and NS TF/s per
GPU) are entries too, never written to `steps.jsonl`.

Adding a metric: fill it in the engine (`metrics.extra["<name>"]`) and add one entry here.
No torch: collectors and reports read the registry on machines without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Origin = Literal["worker", "field", "extra", "telemetry", "derived"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StepMetric:
    """One per-step metric."""

    doc: str
    """What it measures, with its unit."""
    origin: Origin = "extra"
    """Who fills it: the worker (step, warmup, tokens, loss), a `StepMetrics` field, a key of the engine's `extra`,
    the GPU telemetry sampler (`bench.telemetry`), or derived from the others (not written)."""
    always: bool = False
    """Written on every line (None where not measurable); False: written only when measured."""
    summary: Literal["", "median"] = ""
    """`median`: the run summary has `<name>_median` over the steady window."""
    sink: str = ""
    """Its scalar name in every metrics sink (`bench.sinks`): Megatron-Bridge's training-log name where Bridge logs
    it (`megatron.bridge.training.utils.train_utils`); '' = not logged there."""
    mlflow: str = ""
    """Its MLflow name where Bridge's MLflow logger uses another one than `sink` ('' = `sink`)."""
    regress: bool | None = None
    """Compared with the golden rows by `bench.results.regress` (its summary column): True when a higher value is
    worse, False when a lower one is; None = not compared."""
    column: str = ""
    """The summary column `regress` compares ('' = the metric's own name)."""


METRICS: dict[str, StepMetric] = {
    "step": StepMetric(doc="Step index (0-based).", origin="worker", always=True),
    "warmup": StepMetric(doc="The step is in the warm-up window (left out of the summary): 1 or 0.", origin="worker",
                         always=True, sink="warmup"),
    "step_s": StepMetric(doc="Wall time of the whole step (s).", origin="field", always=True, sink="iteration-time",
                         regress=True, column="step_s_median"),
    "fwd_bwd_s": StepMetric(doc="Forward + backward of all micro-batches (s).", origin="field", always=True,
                            summary="median"),
    "optim_s": StepMetric(doc="`optimizer.step()`, Newton-Schulz included (s).", origin="field", always=True,
                          summary="median", sink="optimizer-time", regress=True, column="optim_s_median"),
    "ns_s": StepMetric(doc="Inside the orthogonalize calls (s); 0 for AdamW.", origin="field", always=True,
                       summary="median"),
    "comm_s": StepMetric(doc="Gradient synchronisation where it is a separate phase (s).", origin="field",
                         always=True, summary="median"),
    "tokens": StepMetric(doc="Tokens of the global batch.", origin="worker", always=True),
    "loss": StepMetric(doc="Training loss, mean over the ranks that have one.", origin="worker", always=True,
                       sink="lm loss"),
    "peak_mem_bytes": StepMetric(doc="Peak GPU memory (or peak RSS on CPU) of a rank (bytes).", origin="field",
                                 always=True, sink="mem-max-allocated-bytes", regress=True),
    "ns_flops": StepMetric(doc="FLOPs of the Newton-Schulz calls a rank executed (plain convention).",
                           origin="field", always=True),
    "cpu_s": StepMetric(
        doc="CPU time of the step (s; hf engine: the process; bridge: the thread running its loop).",
        always=True,
        summary="median",
    ),
    "adamw_s": StepMetric(doc="The AdamW side of the optimizer step (s).", always=True, summary="median"),
    "clip_s": StepMetric(doc="Gradient clipping (s).", always=True, summary="median"),
    "grad_norm": StepMetric(doc="Global gradient norm before clipping.", always=True, sink="grad-norm"),
    "lr": StepMetric(doc="Learning rate of the step (the first parameter group; the scheduler's value).",
                     sink="learning-rate"),
    "mem_end_bytes": StepMetric(
        doc="GPU memory still allocated when the step has ended (bytes): weights, gradients and optimizer state; "
        "`peak_mem_bytes` less it is what the step held only while it ran.",
        summary="median",
    ),
    "alloc_retries": StepMetric(doc="The CUDA caching allocator's cumulative `num_alloc_retries` (a rising count "
                                "is memory pressure).", always=True),
    "ns_overlap_s": StepMetric(doc="NS started in the backward on a side stream (s, `optimizer.ns_overlap`)."),
    "spec_used": StepMetric(doc="Speculative NS results used at the step (`optimizer.ns_overlap`)."),
    "spec_discarded": StepMetric(doc="Speculative NS results discarded (clipping changed the gradients)."),
    "bridge_tflops_per_gpu": StepMetric(doc="Bridge's own FLOP count over our step time (TF/s per GPU)."),
    "skipped_updates": StepMetric(doc="Parameter updates our optimizers skipped in the step "
                                  "(`nonfinite_policy=skip`)."),
    "sm_mhz": StepMetric(doc="Mean SM clock over the step (MHz).", origin="telemetry"),
    "mem_mhz": StepMetric(doc="Mean memory clock over the step (MHz).", origin="telemetry"),
    "power_w": StepMetric(doc="Mean board power over the step (W).", origin="telemetry"),
    "temp_c": StepMetric(doc="Highest GPU temperature over the step (C).", origin="telemetry"),
    "throttle_reasons": StepMetric(doc="NVML clock-event reasons seen in the step (bit mask).", origin="telemetry"),
    "throttled": StepMetric(doc="A thermal or hardware slowdown was among the reasons "
                            "(`bench.results.intervals.throttled`).", origin="telemetry"),
    "model_tflops_per_gpu": StepMetric(doc="Model FLOPs over step time (TF/s per GPU, `record.tflops_per_gpu`).",
                                       origin="derived", sink="throughput/tflops/device",
                                       mlflow="throughput/tflops_per_device", regress=False),
    "tokens_per_s": StepMetric(doc="Tokens of the global batch over step time (all GPUs).", origin="derived",
                               sink="throughput/tokens_per_sec"),
    "mfu": StepMetric(doc="Model TF/s per GPU over the GPU's dense bf16 peak (`hardware.peak_bf16_tflops`); "
                      "left out where the peak is unknown.", origin="derived", sink="throughput/mfu"),
    "ns_tflops_per_gpu": StepMetric(doc="NS FLOPs over step time (TF/s per GPU).", origin="derived",
                                    sink="throughput/ns_tflops/device"),
}  # fmt: skip
"""Step metric -> its entry, in the order of a `steps.jsonl` line."""


def step_keys() -> tuple[str, ...]:
    """The fixed vocabulary of a `steps.jsonl` line (written on every line)."""
    return tuple(k for k, m in METRICS.items() if m.always and m.origin != "derived")


def optional_keys() -> tuple[str, ...]:
    """Fields of a `steps.jsonl` line written only when measured (the probes of `bench.probes` add their own)."""
    return tuple(k for k, m in METRICS.items() if not m.always and m.origin != "derived")


def of(origin: Origin) -> tuple[str, ...]:
    """The metrics one source fills."""
    return tuple(k for k, m in METRICS.items() if m.origin == origin)


def medians() -> tuple[str, ...]:
    """The metrics whose steady-window median the run summary has (`<name>_median`)."""
    return tuple(k for k, m in METRICS.items() if m.summary == "median")


def sink_names() -> dict[str, str]:
    """Metric -> its scalar name in every sink."""
    return {k: m.sink for k, m in METRICS.items() if m.sink}


def mlflow_names() -> dict[str, str]:
    """Metric -> its MLflow name (Bridge's where it differs from the other sinks', through `mlflow_name`)."""
    return {k: mlflow_name(m.mlflow or m.sink) for k, m in METRICS.items() if m.sink}


def mlflow_name(name: str) -> str:
    """A scalar name as Bridge's MLflow logger writes it (`mlflow_utils._sanitize_mlflow_metrics`): spaces kept,
    `@` as `_at_`, one `/` after the first part, other characters outside `[/\\w.\\- :]` as `_`."""
    out = re.sub(r"/+", "/", name.replace("@", "_at_"))
    if "/" in out:
        first, rest = out.split("/", 1)
        out = first + "/" + rest.replace("/", "_")
    return re.sub(r"[^/\w.\- :]", "_", out)


def regressed() -> dict[str, bool]:
    """Summary column compared by the regression check -> True when a higher value is worse."""
    return {m.column or k: m.regress for k, m in METRICS.items() if m.regress is not None}
