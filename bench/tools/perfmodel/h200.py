"""Prediction of the single-H200 Megatron measurements.

Reads run records: by default the data file `calibration.MEGATRON_RUNS` (extracted from a Megatron H200
report, provenance inside), or any folder of run records (`**/run.json`), and predicts each run from its resolved
config. A folder with only a `results.csv` (bench.results.collect format: one row per run with `experiment`,
`status`, `step_s_median`, `optim_s_median`, ...) has each run's config re-composed from its experiment and batch
columns. Compares the predicted step and optimizer-step times. Profile: `ours` for our optimizer
implementation, `published` otherwise (on one GPU the profiles differ only in the NS kernels and launches).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from bench.tools.perfmodel.calibration import MEGATRON_RUNS, load_runs

TOLERANCE = 0.10


def _float(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def _overrides(row: dict[str, str]) -> list[str]:
    out = [f"experiment={row['experiment']}"]
    for col, key in (
        ("mbs", "parallelism.mbs"),
        ("gbs", "parallelism.gbs"),
        ("seq_length", "model.seq_length"),
    ):
        if row.get(col) not in (None, ""):
            out.append(f"{key}={int(float(row[col]))}")
    return out


def _typed(cfg: dict[str, Any]) -> Any:
    """RootConfig from a run record's resolved config dict (unknown keys dropped)."""
    from dataclasses import fields

    from muonbench import engines, schema

    def build(cls: type, d: dict[str, Any]) -> Any:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    cfg = schema.lift_record(cfg)
    opt_cls = schema.optimizer_schemas()[cfg["optimizer"]["name"]]
    parallelism = build(schema.ParallelismConfig, cfg["parallelism"])
    parallelism.distribution = build(schema.DistributionConfig, cfg["parallelism"]["distribution"])
    return schema.RootConfig(
        model=build(schema.ModelConfig, cfg["model"]),
        parallelism=parallelism,
        optimizer=build(opt_cls, cfg["optimizer"]),
        hardware=build(schema.HardwareConfig, cfg["hardware"]),
        precision=build(schema.PrecisionConfig, cfg["precision"]),
        engine=build(engines.spec(cfg["engine"]["name"]).config, cfg["engine"]),
        launcher=build(schema.LauncherConfig, cfg["launcher"]),
        experiment_name=cfg.get("experiment_name", ""),
    )


FIT_RUN = "20261129_h200_06a7769/qwen_adamw"
"""The one run the H200 row's fitted value is fitted on (the others are predictions)."""
OUT_OF_SCOPE = {"sequential_mlp": "experts as a Python loop (launch-bound): no model term"}


def _row(
    name: str, cfg: Any, implementation: str | None, optimizer: str | None, step: float, optim: float | None
) -> dict[str, Any]:
    from bench.tools.perfmodel.model import predict

    profile = "ours" if implementation == "ours" else "published"
    pred = predict(cfg, profile)
    if getattr(cfg.optimizer, "ns_overlap", False):  # the NS ran inside fwd+bwd: no optimizer-step comparison
        optim = None
    return {
        "experiment": name,
        "optimizer": optimizer,
        "profile": profile,
        "measured_step_s": step,
        "predicted_step_s": pred.step_time_s,
        "step_rel_error": pred.step_time_s / step - 1.0,
        "measured_optim_s": optim,
        "predicted_optim_s": pred.breakdown["optimizer_step"],
        "optim_rel_error": None if not optim else pred.breakdown["optimizer_step"] / optim - 1.0,
        "ns_overlap": bool(getattr(cfg.optimizer, "ns_overlap", False)),
    }


def record_comparisons(path: Path = MEGATRON_RUNS) -> list[dict[str, Any]]:
    """From run records (a data file, or `**/run.json` with a summary under a folder): the resolved config is used
    as is."""
    out: list[dict[str, Any]] = []
    for rec in load_runs(path):
        summary, cfg = rec.get("summary") or {}, rec.get("config") or {}
        step = _float(summary.get("step_s_median"))
        if rec.get("status") != "ok" or step is None or (cfg.get("hardware") or {}).get("name") != "h200":
            continue
        run = rec["run"]
        row = _row(
            run,
            _typed(cfg),
            cfg["optimizer"].get("implementation"),
            cfg["optimizer"]["name"],
            step,
            _float(summary.get("optim_s_median")),
        )
        experts = rec["experts"]
        row.update(
            {
                "model": cfg["model"]["name"],
                "experts": experts,
                "fit": run == FIT_RUN,
                "scope": OUT_OF_SCOPE.get(experts, ""),
            }
        )
        out.append(row)
    return out


def comparisons(path: Path = MEGATRON_RUNS) -> list[dict[str, Any]]:
    """One dict per successful H200 run: measured and predicted step / optimizer seconds (run records first,
    else the results.csv rows re-composed from their experiment and batch columns)."""
    from muonbench import load

    records = record_comparisons(path)
    if records:
        return records
    csv_path = path / "results.csv"
    if not path.is_dir() or not csv_path.exists():
        return []
    out: list[dict[str, Any]] = []
    with csv_path.open() as f:
        for row in csv.DictReader(f):
            step = _float(row.get("step_s_median"))
            if row.get("status") != "ok" or step is None or not row.get("experiment"):
                continue
            if row.get("hardware_name") not in (None, "", "h200"):
                continue
            try:
                cfg = load(_overrides(row))
            except ValueError as exc:
                out.append({"experiment": row["experiment"], "error": str(exc)[:200]})
                continue
            out.append(
                _row(
                    row["experiment"],
                    cfg,
                    row.get("implementation"),
                    row.get("optimizer"),
                    step,
                    _float(row.get("optim_s_median")),
                )
            )
    return out


def compare(path: Path = MEGATRON_RUNS) -> str:
    """Markdown paragraph: the comparison table, or that the measurement is pending."""
    rows = comparisons(path)
    if not rows:
        return (
            f"Pending: `{path}` holds no successful H200 run. Predictions for its configs: `python -m bench.tools.project "
            "experiment=h200/qwen3_30b_a3b_slice_muon_1gpu profile=ours` (and `..._adamw_1gpu`)."
        )
    lines = [
        (
            "| run | model | optimizer | profile | step measured (s) | predicted | error | optimizer measured (s) "
            "| predicted | error | note |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['experiment']} | - | - | - | - | - | config error: {r['error']} | - | - | - | - |"
            )
            continue
        opt_m = "-" if r["measured_optim_s"] is None else f"{r['measured_optim_s']:.3f}"
        opt_e = "-" if r["optim_rel_error"] is None else f"{100 * r['optim_rel_error']:+.1f}%"
        note = "fit" if r.get("fit") else (r.get("scope") or "prediction")
        if r.get("ns_overlap"):
            note += " (ns_overlap: optimizer step not compared)"
        lines.append(
            f"| {r['experiment']} | {r.get('model', '')} | {r['optimizer']} | {r['profile']} | "
            f"{r['measured_step_s']:.3f} | {r['predicted_step_s']:.3f} | {100 * r['step_rel_error']:+.1f}% | "
            f"{opt_m} | {r['predicted_optim_s']:.3f} | {opt_e} | {note} |"
        )
    ok = [r for r in rows if "error" not in r and not r.get("scope") and not r.get("fit")]
    within = sum(abs(r["step_rel_error"]) <= TOLERANCE for r in ok)
    lines += [
        "",
        (
            f"{within} of {len(ok)} predicted runs within {100 * TOLERANCE:.0f}% on the step time (the H200 "
            "row's fitted value for this engine, the memory-bound kernel bandwidth of this TE-free engine, is fitted on the "
            "run marked `fit`; runs outside the model's scope are not counted)."
        ),
    ]
    if within < len(ok):
        lines += [
            "",
            (
                "The model is a roofline of GEMMs, attention, activation traffic and communication plus the "
                "optimizer; it has no term for framework overhead of the forward/backward (launch-bound expert "
                "loops, unfused kernels without Transformer Engine) and models AdamW as the fused distributed "
                "optimizer. A run far below that roofline measures the engine, not the hardware: compare its "
                "model TF/s with the prediction's."
            ),
        ]
    return "\n".join(lines)
