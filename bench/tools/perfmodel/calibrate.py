"""Calibration against NVIDIA blog Table 1 (docs/references.md#nvidia-table1, #mb-perf-recipes) and the fits of the rows' fitted values (constants.FITTED).

The published rows are model TF/GPU (AdamW; Muon without its "Muon" FLOPs). `fit_gb300_hbm` finds the achieved
HBM fraction of memory-bound kernels that minimises the largest relative error over the four rows (the other
constants stay as sourced in `constants`); the committed value is `constants.GB300_HBM_FIT`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from bench.tools.perfmodel import constants as C
from bench.tools.perfmodel.model import predict
from muonbench.schema import RootConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedRow:
    """One number of Table 1."""

    experiment: str
    """conf/experiment path that reproduces the run's layout."""
    model_tflops: float
    label: str


TABLE1: tuple[PublishedRow, ...] = (
    PublishedRow(experiment="gb300/kimi_k2_adamw", model_tflops=1051.0, label="Kimi K2, 256 GB300, AdamW"),
    PublishedRow(
        experiment="gb300/kimi_k2_muon", model_tflops=1029.0, label="Kimi K2, 256 GB300, Muon (model)"
    ),
    PublishedRow(
        experiment="gb300/qwen3_30b_a3b_adamw", model_tflops=713.0, label="Qwen3-30B-A3B, 8 GB300, AdamW"
    ),
    PublishedRow(
        experiment="gb300/qwen3_30b_a3b_muon",
        model_tflops=686.0,
        label="Qwen3-30B-A3B, 8 GB300, Muon (model)",
    ),
)
TOLERANCE = 0.03


def load_row(row: PublishedRow, extra: list[str] | None = None) -> RootConfig:
    from muonbench import load

    return load([f"experiment={row.experiment}", *(extra or [])])


@contextmanager
def hbm_fraction(hardware: str, value: float, field: str = "hbm") -> Iterator[None]:
    """Temporarily replace a hardware row's memory-bound efficiency (`field`: hbm, or hbm_bridge for the bridge
    engine) for fitting and sensitivity."""
    old = C.FITTED[hardware]
    C.FITTED[hardware] = replace(old, **{field: C.Sourced(value=value, source="trial value")})
    try:
        yield
    finally:
        C.FITTED[hardware] = old


def calibration(configs: dict[str, RootConfig] | None = None) -> list[dict[str, float | str]]:
    """Predicted vs published model TF/GPU of Table 1 with the `published` profile (and `ours` alongside)."""
    out: list[dict[str, float | str]] = []
    for row in TABLE1:
        cfg = (configs or {}).get(row.experiment) or load_row(row)
        pub = predict(cfg, "published")
        ours = predict(cfg, "ours")
        out.append(
            {
                "row": row.label,
                "experiment": row.experiment,
                "published_tflops": row.model_tflops,
                "predicted_tflops": pub.tflops_per_gpu_model,
                "rel_error": pub.tflops_per_gpu_model / row.model_tflops - 1.0,
                "predicted_step_s": pub.step_time_s,
                "ours_tflops": ours.tflops_per_gpu_model,
                "ours_step_s": ours.step_time_s,
                "ns_tflops_published": pub.tflops_per_gpu_ns,
                **{f"published_{k}_s": v for k, v in pub.breakdown.items()},
                **{f"ours_{k}_s": v for k, v in ours.breakdown.items()},
            }
        )
    return out


def fit_gb300_hbm(lo: float = 0.2, hi: float = 1.0, iters: int = 40) -> tuple[float, float]:
    """(fraction, worst relative error): golden-section minimax over Table 1 with the published profile."""
    configs = {row.experiment: load_row(row) for row in TABLE1}

    def worst(x: float) -> float:
        with hbm_fraction("gb300", x):
            return max(abs(float(r["rel_error"])) for r in calibration(configs))

    return _minimise(worst, lo, hi, iters)


def _minimise(worst: Callable[[float], float], lo: float, hi: float, iters: int) -> tuple[float, float]:
    """(x, worst(x)) at the minimum of a unimodal `worst` on [lo, hi], by golden section."""
    g = (5**0.5 - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = worst(c), worst(d)
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = worst(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = worst(d)
    x = (a + b) / 2
    return x, worst(x)


def what_if_ns_host(ms: float) -> list[dict[str, float | str]]:
    """Calibration with another per-matrix host cost of the published NS loop (sensitivity, not the model)."""
    from bench.tools.perfmodel import nscost

    nscost.HOST_OVERRIDE_MS["published"] = ms
    try:
        return calibration()
    finally:
        nscost.HOST_OVERRIDE_MS.pop("published", None)


def fit_h200_hbm(lo: float = 0.05, hi: float = 1.0, iters: int = 30) -> tuple[float, float]:
    """(fraction, relative error at it): the H200 row's memory-bound bandwidth fraction that reproduces the step time
    of the one Megatron run `h200.FIT_RUN` (bisection; the predicted step falls as the fraction grows)."""
    from bench.tools.perfmodel import h200
    from bench.tools.perfmodel.calibration import MEGATRON_RUNS, load_runs

    rec = next(r for r in load_runs(MEGATRON_RUNS) if r["run"] == h200.FIT_RUN)
    cfg, measured = h200._typed(rec["config"]), float(rec["summary"]["step_s_median"])

    def err(x: float) -> float:
        with hbm_fraction("h200", x):
            return predict(cfg, "published").step_time_s / measured - 1.0

    a, b = lo, hi
    for _ in range(iters):
        mid = (a + b) / 2
        a, b = (mid, b) if err(mid) > 0 else (a, mid)
    x = (a + b) / 2
    return x, err(x)


def fit_h200_bridge_hbm(
    lo: float = 0.05, hi: float = 1.0, iters: int = 40, *, exclude: frozenset[str] = frozenset()
) -> tuple[float, float]:
    """(fraction, worst relative error): the H200 row's memory-bound fraction for the bridge engine, minimax over
    the median step of each optimizer's runs in `calibration.BRIDGE_RUNS` (each optimizer's runs share a config),
    without the runs named in `exclude` (leave-one-out)."""
    from bench.tools.perfmodel import h200
    from bench.tools.perfmodel.calibration import BRIDGE_RUNS, load_runs

    by_optimizer: dict[str, list[dict[str, Any]]] = {}
    for rec in (r for r in load_runs(BRIDGE_RUNS) if r["run"] not in exclude):
        by_optimizer.setdefault(rec["config"]["optimizer"]["name"], []).append(rec)
    targets = []
    for recs in by_optimizer.values():
        cfg = recs[0]["config"]
        profile = "ours" if cfg["optimizer"].get("implementation") == "ours" else "published"
        median = statistics.median(float(r["summary"]["step_s_median"]) for r in recs)
        targets.append((h200._typed(cfg), profile, median))

    def worst(x: float) -> float:
        with hbm_fraction("h200", x, "hbm_bridge"):
            return max(abs(predict(cfg, profile).step_time_s / m - 1.0) for cfg, profile, m in targets)

    return _minimise(worst, lo, hi, iters)


def optimizer_targets(exclude: frozenset[str] = frozenset()) -> list[tuple[Any, str, float]]:
    """(config, profile, measured optimizer step) of the committed Muon runs whose NS plan times were measured, but
    those named in `exclude`."""
    from bench.tools.perfmodel import h200
    from bench.tools.perfmodel.calibration import GPU_RUNS, load_runs

    out = []
    for rec in load_runs(GPU_RUNS):
        cfg, optim = rec["config"], (rec.get("summary") or {}).get("optim_s_median")
        if rec.get("ns_plan_ms") and optim and not cfg["optimizer"].get("ns_overlap") and rec["run"] not in exclude:
            profile = "ours" if cfg["optimizer"].get("implementation") == "ours" else "published"
            out.append((h200._typed(cfg), profile, float(optim)))
    return out


def fit_h200_optimizer_hbm(
    lo: float = 0.1, hi: float = 1.0, iters: int = 30, *, exclude: frozenset[str] = frozenset()
) -> tuple[float, float]:
    """(fraction, worst relative error): the H200 row's memory-bound fraction of the optimizer step, minimax over
    `optimizer_targets` (without the runs in `exclude`: leave-one-out)."""
    targets = optimizer_targets(exclude)

    def worst(x: float) -> float:
        with hbm_fraction("h200", x, "optimizer_hbm"):
            return max(abs(predict(c, p).breakdown["optimizer_step"] / m - 1.0) for c, p, m in targets)

    return _minimise(worst, lo, hi, iters)
