"""The step-metric registry: a new per-step metric is one entry in `bench.metrics.METRICS` plus the engine filling
it; the worker's reduction, the step log, the summary and the sinks read the entry."""

from __future__ import annotations

import pytest

from bench import metrics, sinks, worker
from bench.engines import RankInfo, StepMetrics
from bench.results import record


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> metrics.StepMetric:
    entry = metrics.StepMetric(doc="A toy phase (s).", always=True, summary="median", sink="toy-time")
    monkeypatch.setitem(metrics.METRICS, "toy_s", entry)
    return entry


def _step(i: int, toy_s: float) -> StepMetrics:
    return StepMetrics(
        step_s=1.0, fwd_bwd_s=0.5, optim_s=0.2, ns_s=0.1, comm_s=None, tokens=8, loss=2.0, peak_mem_bytes=None,
        extra={"toy_s": toy_s},
    )  # fmt: skip


def test_a_toy_metric_needs_only_its_entry(toy: metrics.StepMetric, tmp_path) -> None:
    """Localises a consumer with its own list of step keys (a metric filled by the engine and dropped later)."""
    rank = RankInfo(rank=0, world_size=1, local_rank=0)
    log = record.StepLog(tmp_path)
    for i, value in enumerate((9.0, 1.0, 2.0, 3.0)):
        row = worker.reduce_metrics(_step(i, value), rank, "cpu")
        assert row["toy_s"] == value
        log.write({"step": i, "warmup": i == 0, **row})
    log.close()
    steps = record.read_steps(tmp_path)
    assert [r["toy_s"] for r in steps] == [9.0, 1.0, 2.0, 3.0]
    summary = record.summarize(steps, world_size=1, model_flops_per_step=None)
    assert summary is not None and summary["toy_s_median"] == 2.0
    assert sinks.scalars(steps[1], model_flops_per_step=None, world_size=1)["toy-time"] == 1.0


def test_the_registry_is_the_vocabulary() -> None:
    """Localises a second list of keys drifting from the registry (the worker, the log and collect each had one)."""
    assert metrics.step_keys()[:3] == ("step", "warmup", "step_s")
    assert set(metrics.of("telemetry")) <= set(metrics.optional_keys())
    assert not set(metrics.of("derived")) & {*metrics.step_keys(), *metrics.optional_keys()}
    assert set(StepMetrics.__dataclass_fields__) - {"extra", "tokens", "loss"} == set(metrics.of("field"))
    from bench.results import regress

    assert regress.METRICS == metrics.regressed()
