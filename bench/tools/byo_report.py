"""Report of your own models measured on one GPU: each run beside the performance model's prediction, and the
Muon/AdamW model-only ratio per model and engine with its crossover interval.

    python -m bench.tools.byo_report RUNS_DIR --out REPORT_DIR

RUNS_DIR holds `<model>/<engine>/.../run.json` (+ `steps.jsonl`) as `reports/byo_models_h200_*/reproduce.sh`
writes them: per model, the megatron engine's and the bridge engine's runs, each in crossover order on one host.
Writes to REPORT_DIR: `results.csv` (one row per run: measured and predicted step and optimizer-step seconds, first
step, model TF/s per GPU, peak memory), `summary.json` (per model and engine: medians, the ratio and its 95%
bootstrap interval, `bench.tools.crossover`), `predicted_vs_measured.png`, `run.json` (provenance of every run)
and `runs/` (the run records themselves).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from bench.results.record import first_step
from bench.tools import crossover


def _runs_under(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("run.json") if "report" not in p.parent.parts)


def predict_run(record: dict[str, Any]) -> dict[str, float]:
    """The performance model's step and optimizer-step seconds of one run record's resolved config."""
    from bench.tools.perfmodel.h200 import _typed
    from bench.tools.perfmodel.model import predict

    cfg = record["config"]
    profile = "ours" if cfg["optimizer"].get("implementation") == "ours" else "published"
    pred = predict(_typed(cfg), profile)
    return {"predicted_step_s": pred.step_time_s, "predicted_optim_s": pred.breakdown["optimizer_step"]}


def rows(root: Path) -> list[dict[str, Any]]:
    """One row per run under root, in start order."""
    out = []
    for run in _runs_under(root):
        rec = json.loads((run / "run.json").read_text())
        cfg, s = rec.get("config") or {}, rec.get("summary") or {}
        steps = [json.loads(x) for x in (run / "steps.jsonl").read_text().splitlines() if x.strip()] if (
            run / "steps.jsonl"
        ).exists() else []
        row = {
            "model": cfg.get("model", {}).get("name"),
            "engine": cfg.get("engine", {}).get("name"),
            "optimizer": cfg.get("optimizer", {}).get("name"),
            "run_id": rec.get("run_id"),
            "status": rec.get("status"),
            "start_time": rec.get("start_time"),
            "load_avg_1m": (rec.get("hardware") or {}).get("load_avg_1m"),
            "step_s_median": s.get("step_s_median"),
            "step_s_iqr": s.get("step_s_iqr"),
            "optim_s_median": s.get("optim_s_median"),
            "fwd_bwd_s_median": s.get("fwd_bwd_s_median"),
            "first_step_s": first_step(steps)["first_step_s"],
            "model_tflops_per_gpu": s.get("model_tflops_per_gpu"),
            "peak_mem_gb": (s.get("peak_mem_bytes") or 0) / 1e9 or None,
            "path": run,
        }
        if rec.get("status") == "ok" and s.get("step_s_median"):
            row |= predict_run(rec)
            row["step_rel_error"] = row["predicted_step_s"] / row["step_s_median"] - 1.0
        out.append(row)
    return sorted(out, key=lambda r: r["start_time"] or "")


def summaries(root: Path, table: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`<model>/<engine>` -> the crossover summary of its runs (ratio adamw/variant step time with interval)."""
    out: dict[str, dict[str, Any]] = {}
    for key in sorted({(r["model"], r["engine"]) for r in table}):
        folders = {r["path"].parent for r in table if (r["model"], r["engine"]) == key}
        runs = [x for folder in sorted(folders) for x in crossover.load_runs(folder)]
        runs.sort(key=lambda r: r["start_time"])
        if len({r["optimizer"] for r in runs}) == 2 and all(r["steady"] for r in runs):
            out["/".join(key)] = crossover.summarize(runs, "adamw")
    return out


COLUMNS = (
    "model", "engine", "optimizer", "run_id", "status", "load_avg_1m", "step_s_median", "step_s_iqr",
    "predicted_step_s", "step_rel_error", "optim_s_median", "predicted_optim_s", "fwd_bwd_s_median", "first_step_s",
    "model_tflops_per_gpu", "peak_mem_gb",
)  # fmt: skip


def write(root: Path, out: Path) -> dict[str, Any]:
    table = rows(root)
    if not table:
        raise ValueError(f"no run.json under {root}")
    summary = summaries(root, table)
    out.mkdir(parents=True, exist_ok=True)
    lines = [",".join(COLUMNS)]
    for r in table:
        cells = []
        for c in COLUMNS:
            v = r.get(c)
            cells.append("" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v))
        lines.append(",".join(cells))
    (out / "results.csv").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    dest = out / "runs"
    for r in table:
        target = dest / r["model"] / r["engine"] / r["path"].name
        if r["path"].resolve() != target.resolve():
            shutil.copytree(r["path"], target, dirs_exist_ok=True)
    provenance = []
    for r in table:
        rec = json.loads((r["path"] / "run.json").read_text())
        provenance.append({k: rec.get(k) for k in ("run_id", "status", "command", "git", "versions", "hardware",
                                                    "start_time", "end_time")})  # fmt: skip
    (out / "run.json").write_text(json.dumps({"runs": provenance, "generated_by": " ".join(sys.argv)}, indent=1,
                                             default=str) + "\n")  # fmt: skip
    _plot(table, out / "predicted_vs_measured.png")
    return {"rows": table, "summary": summary}


def _plot(table: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in table if r.get("predicted_step_s")]
    if not ok:
        return
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(ok) + 2), 4))
    xs = range(len(ok))
    ax.bar([x - 0.2 for x in xs], [r["step_s_median"] for r in ok], width=0.4, label="measured (median)")
    ax.bar([x + 0.2 for x in xs], [r["predicted_step_s"] for r in ok], width=0.4, label="predicted", alpha=0.7)
    ax.set_xticks(list(xs), [f"{r['model']}\n{r['engine']}\n{r['optimizer']}" for r in ok], fontsize=7)
    ax.set_ylabel("step time (s)")
    ax.set_title("one-GPU slices: measured step time and the performance model's prediction")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tools.byo_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, help="folder holding <model>/<engine>/<run>/run.json")
    ap.add_argument("--out", type=Path, required=True, help="report folder to write")
    args = ap.parse_args(argv)
    try:
        res = write(args.runs, args.out)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for r in res["rows"]:
        pred = r.get("predicted_step_s")
        print(
            f"{r['model']:<14} {r['engine']:<9} {r['optimizer']:<6} {r['status']:<6} step "
            f"{r['step_s_median'] or float('nan'):.3f} s, predicted {pred or float('nan'):.3f} s"
            + (f" ({r['step_rel_error']:+.1%})" if pred else "")
        )
    for key, s in res["summary"].items():
        lo, hi = s["ratio_model_only_ci95"]
        print(f"{key}: model-only ratio {s['variant']}/adamw {s['ratio_model_only']:.3f} (95% {lo:.3f}-{hi:.3f})")
    return 0


if __name__ == "__main__":
    from bench import entry

    raise SystemExit(entry.run(main))
