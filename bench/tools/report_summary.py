"""`summary.json` for the reports written before the comparison tools wrote one, extracted from their `results.csv`.

`python -m bench.tools.report_summary REPORT` rewrites `reports/REPORT/summary.json`. Only runs recorded `ok` enter
a figure; each group lists the run ids it pools (`runs_used`). These reports predate the 95% interval on run
statistics (`bench.results.intervals`): a ratio carries `no_interval` with its spread instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from bench.tools.docs import REPO
from bench.tools.ns_kernels import plan_rows


def _range(s: pd.Series) -> list[float]:
    return [round(float(s.min()), 4), round(float(s.max()), 4)]


def megatron_flops(report: Path) -> dict[str, Any]:
    """One group per configuration hash; a run's ratio is its model TF/s over the mean of the same batch's AdamW runs
    (batch = date, host and commit of the run id), a group's the mean of its runs' ratios; likewise its
    forward-backward time minus that batch's AdamW mean."""
    d = pd.read_csv(report / "results.csv")
    d = d[d.status == "ok"].copy()
    d["batch"] = d.run_id.str.split("_").str[:3].str.join("_")
    adamw_mean = d[d.optimizer == "adamw"].groupby("batch").model_tflops_per_gpu.mean()
    adamw_fwd_bwd = d[d.optimizer == "adamw"].groupby("batch").fwd_bwd_s_median.mean()
    groups = []
    for cfg, g in d.groupby("config_hash", sort=False):
        first = g.iloc[0]
        row: dict[str, Any] = {
            "config_hash": cfg,
            "optimizer": first.optimizer,
            "implementation": first.implementation,
            "split_gate_up": bool(first["optimizer.split_gate_up"]) if pd.notna(first["optimizer.split_gate_up"]) else None,
            "ns_precision": first["optimizer.ns_precision"] if pd.notna(first["optimizer.ns_precision"]) else None,
            "ns_overlap": bool(first["optimizer.ns_overlap"]) if pd.notna(first["optimizer.ns_overlap"]) else None,
            "gbs": int(first.gbs),
            "num_runs": len(g),
            "batches": sorted(g.batch.unique()),
            "steady_steps_range": [int(g.num_steady_steps.min()), int(g.num_steady_steps.max())],
            "step_s_range": _range(g.step_s_median),
            "optim_s_range": _range(g.optim_s_median),
            "runs_used": list(g.run_id),
        }
        if first.optimizer != "adamw":
            r = (g.model_tflops_per_gpu / g.batch.map(adamw_mean)).dropna()
            if len(r):
                row["ratio"] = float(r.mean())
                se = float(r.std() / len(r) ** 0.5) if len(r) > 1 else None
                row["ratio_se"] = se
                row["fwd_bwd_minus_adamw_s_range"] = _range((g.fwd_bwd_s_median - g.batch.map(adamw_fwd_bwd)).dropna())
                row["no_interval"] = {
                    "ratio": (f"s.e. {se:.4f} over {len(r)} runs, each against its batch's AdamW mean"
                              if se is not None else "one run, against its batch's AdamW mean")
                }
        groups.append(row)
    full = d[(d.optimizer == "adamw") & (d.gbs == d.gbs.max())]
    adamw = {"gbs": int(full.gbs.iloc[0]), "num_runs": len(full), "step_s_range": _range(full.step_s_median),
             "optim_s_range": _range(full.optim_s_median)}
    return {"source": "results.csv (ok runs), python -m bench.tools.report_summary", "adamw_full_step": adamw,
            "groups": groups}


def _bridge_rows(report: Path) -> pd.DataFrame:
    d = pd.read_csv(report / "results.csv")
    d["batch_no"] = d.batch.str.split().str[0].astype(int)
    return d


def bridge_h200(report: Path) -> dict[str, Any]:
    """Batch-wise figures of the Bridge report from its ok runs: optimizer-step medians, the whole-step ratio where a
    batch holds an ok run of both optimizers, and Bridge against the megatron engine in batch 3."""
    d = _bridge_rows(report)
    excluded = [{"run_id": r.run_id, "status": r.status} for r in d.itertuples() if r.status != "ok"]
    d = d[d.status == "ok"]
    bridge = d[d.engine == "bridge"]
    ours = bridge[bridge.optimizer == "muon (ours)"]
    builtin = bridge[bridge.optimizer == "muon_megatron (built-in)"]
    adamw = bridge[bridge.optimizer == "adamw"]
    out: dict[str, Any] = {
        "source": "results.csv (ok runs), python -m bench.tools.report_summary",
        "excluded_runs": excluded,
        "ours_optim_s_median": float(ours.optim_s_median.median()),
        "builtin_optim_s_median": float(builtin.optim_s_median.median()),
        "adamw_optim_s_range": _range(adamw.optim_s_median),
        "builtin_over_ours_optim_ratio": float(builtin.optim_s_median.median() / ours.optim_s_median.median()),
        "no_interval": {
            "builtin_over_ours_optim_ratio": "one run each, medians of 3 steady steps, batch 1",
        },
        "runs_used": list(ours.run_id) + list(builtin.run_id) + list(adamw.run_id),
        "whole_step": [],
    }
    for b, g in bridge.groupby("batch_no"):
        o, a = g[g.optimizer == "muon (ours)"], g[g.optimizer == "adamw"]
        if len(o) and len(a):
            out["whole_step"].append({
                "batch": int(b),
                "ratio": float(a.step_s_median.mean() / o.step_s_median.mean()),
                "no_interval": {"ratio": "one run of each optimizer, medians of its steady steps"},
                "runs_used": list(a.run_id) + list(o.run_id),
            })
    b3 = d[d.batch_no == 3]
    eng, br = b3[b3.engine != "bridge"], b3[b3.engine == "bridge"]
    out["bridge_vs_engine_batch3"] = {
        "ratio": float(br.model_tflops_per_gpu.mean() / eng.model_tflops_per_gpu.mean()),
        "engine_tflops_range": _range(eng.model_tflops_per_gpu),
        "bridge_tflops_range": _range(br.model_tflops_per_gpu),
        "no_interval": {
            "ratio": (f"2 runs each in order E B E B, not a crossover; single runs {eng.model_tflops_per_gpu.min():.1f}-"
                      f"{eng.model_tflops_per_gpu.max():.1f} (engine) and {br.model_tflops_per_gpu.min():.1f}-"
                      f"{br.model_tflops_per_gpu.max():.1f} (Bridge) model TF/s")
        },
        "runs_used": list(b3.run_id),
    }
    return out


def ns_kernels(report: Path) -> dict[str, Any]:
    """The layer optimizer step's medians per layout and warm-up (`bench.tools.optim_step`'s JSON files) and the NS
    plan against the fastest peer per shape (`bench.tools.ns_kernels.plan_rows` on `results.json`). One run: medians
    of 20 steps, and of interleaved rounds per shape; no interval."""
    steps: dict[str, dict[str, Any]] = {}
    for name in ("optim_step", "optim_step_buckets", "optim_step_capped_separate", "optim_step_capped_buckets"):
        d = json.loads((report / f"{name}.json").read_text())
        steps[f"{d['layout']}_warmup{d['warmup']}"] = {
            "steps": d["repeats"], "median_ms": {r["impl"]: round(r["median_ms"], 2) for r in d["rows"]}}
    rows = plan_rows(json.loads((report / "results.json").read_text()))
    vs = [r["ours_vs_fastest_peer"] for r in rows]
    run = json.loads((report / "run.json").read_text())
    return {
        "source": "optim_step*.json and results.json, python -m bench.tools.report_summary",
        "git_sha": run["git_sha"],
        "bf16_ceiling_tflops": run["bf16_ceiling_tflops"],
        "layer_step": steps,
        "plan_vs_fastest_peer": {"num_shapes": len(vs), "num_within_2pct": sum(v <= 1.02 for v in vs),
                                 "range": [round(min(vs), 3), round(max(vs), 3)]},
    }


EXTRACTORS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "megatron_h200_flops_202611": megatron_flops,
    "bridge_h200_202612": bridge_h200,
    "ns_kernels_h200_202612": ns_kernels,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tools.report_summary", description=__doc__.split("\n\n")[0])
    p.add_argument("report", choices=sorted(EXTRACTORS))
    args = p.parse_args(argv)
    path = REPO / "reports" / args.report
    (path / "summary.json").write_text(json.dumps(EXTRACTORS[args.report](path), indent=1) + "\n")
    print(f"wrote {path / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
