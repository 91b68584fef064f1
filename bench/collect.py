"""Collect run records into one tidy table: one row per run (config keys + summary metrics + provenance).

    python -m bench.collect                       # the runs of the latest `bench.run` invocation (runs/LATEST.json)
    python -m bench.collect --runs runs/ --name my_study

Writes `reports/<name>/results.csv` (one row per run) and `reports/<name>/steps.csv` (one row per run and step,
the loss and time curves the report plots). Failed runs are rows too, with their status and error, so a sweep never
silently shrinks. No torch import.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench import record

CONFIG_COLUMNS: dict[str, str] = {
    "experiment": "experiment_name",
    "model": "model.name",
    "model_family": "model.family",
    "parallelism": "parallelism.name",
    "world_size": "parallelism.world_size",
    "tp": "parallelism.tp",
    "pp": "parallelism.pp",
    "ep": "parallelism.ep",
    "mbs": "parallelism.mbs",
    "gbs": "parallelism.gbs",
    "seq_length": "model.seq_length",
    "optimizer": "optimizer.name",
    "implementation": "optimizer.implementation",
    "engine": "engine.name",
    "device": "engine.device",
    "precision": "precision.name",
    "hardware_name": "hardware.name",
    "peak_bf16_tflops": "hardware.peak_bf16_tflops",
    "steps": "bench.steps",
    "warmup_steps": "bench.warmup_steps",
    "data": "bench.data",
    "report_name": "bench.report_name",
}
"""Column -> dotted path in the resolved config."""
GROUP_COLUMNS = ("experiment", "model", "parallelism", "engine", "device", "precision", "hardware_name")
"""Columns that must match for two runs to be compared (everything except the optimizer)."""


def _get(d: dict[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def run_row(rec: dict[str, Any]) -> dict[str, Any]:
    """The results.csv row of one run record."""
    cfg = rec.get("config") or {}
    err = rec.get("error") or {}
    worker = rec.get("worker") or {}
    hw = rec.get("hardware") or {}
    versions = rec.get("versions") or {}
    git = rec.get("git") or {}
    row: dict[str, Any] = {
        "run_id": rec.get("run_id"),
        "status": rec.get("status"),
        "error_type": err.get("type"),
        "error_message": (str(err["message"])[:300] if err.get("message") else None),
    }
    row.update({col: _get(cfg, path) for col, path in CONFIG_COLUMNS.items()})
    tp, pp, cp = (_get(cfg, f"parallelism.{k}") or 1 for k in ("tp", "pp", "cp"))
    row["dp"] = (row["world_size"] // (tp * pp * cp)) if row["world_size"] else None
    for key, value in sorted((cfg.get("optimizer") or {}).items()):
        if key != "name":
            row[f"optimizer.{key}"] = value if not isinstance(value, (list, dict)) else str(value)
    row.update(rec.get("summary") or {})
    row.update(
        {
            "timer": worker.get("timer"),
            "math_dtype": (worker.get("engine") or {}).get("math_dtype"),
            "optimizer_distribution": (worker.get("engine") or {}).get("optimizer_distribution"),
            "config_hash": rec.get("config_hash"),
            "git_sha": git.get("sha"),
            "git_dirty": git.get("dirty"),
            "torch": versions.get("torch"),
            "transformers": versions.get("transformers"),
            "megatron_core": versions.get("megatron-core"),
            "cpu_model": hw.get("cpu_model"),
            "gpu_name": hw.get("gpu_name"),
            "gpu_count": hw.get("gpu_count"),
            "gpu_driver": hw.get("driver"),
            "visible_gpus": (rec.get("env") or {}).get("CUDA_VISIBLE_DEVICES"),
            "load_avg_1m": hw.get("load_avg_1m"),
            "start_time": rec.get("start_time"),
            "duration_s": rec.get("duration_s"),
            "command": " ".join(rec.get("command") or []),
            "run_dir": rec.get("run_dir"),
        }
    )
    return row


def step_rows(rec: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """The steps.csv rows of one run (run id and optimizer in front of every steps.jsonl line)."""
    opt = _get(rec.get("config") or {}, "optimizer.name")
    return [{"run_id": rec.get("run_id"), "optimizer": opt, **s} for s in record.read_steps(run_dir)]


def latest_runs(out_dir: Path) -> tuple[list[Path], str | None]:
    """Run directories and report name of the latest `bench.run` invocation."""
    manifest = out_dir / "LATEST.json"
    if not manifest.exists():
        raise ValueError(f"{manifest} does not exist: run `python -m bench.run` first, or pass --runs DIR")
    data = record.read_json(manifest)
    return [Path(p) for p in data["runs"]], data.get("report_name")


def collect(run_dirs: list[Path], dest: Path) -> tuple[Any, Any]:
    """Write `dest/results.csv` and `dest/steps.csv`; returns the two DataFrames."""
    import pandas as pd

    rows, steps = [], []
    for d in run_dirs:
        rec = record.read_json(d / "run.json")
        rows.append(run_row(rec))
        steps.extend(step_rows(rec, d))
    results = pd.DataFrame(rows)
    step_df = pd.DataFrame(steps, columns=["run_id", "optimizer", *record.STEP_KEYS])
    dest.mkdir(parents=True, exist_ok=True)
    results.to_csv(dest / "results.csv", index=False)
    step_df.to_csv(dest / "steps.csv", index=False)
    return results, step_df


def terminal_table(results: Any) -> str:
    """A short fixed-width table of the collected runs."""
    cols = [
        "run_id",
        "optimizer",
        "status",
        "step_s_median",
        "optim_s_median",
        "ns_s_median",
        "model_tflops_per_gpu",
        "ns_tflops_per_gpu",
        "loss_last",
    ]
    view = results.reindex(columns=cols)
    return view.to_string(index=False, float_format=lambda v: f"{v:.4g}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.collect", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--runs", nargs="*", type=Path, help="run directories or roots to search (default: latest invocation)"
    )
    ap.add_argument("--out-dir", type=Path, default=Path("runs"), help="bench.out_dir holding LATEST.json")
    ap.add_argument("--name", help="report name (default: bench.report_name of the runs)")
    ap.add_argument("--reports", type=Path, default=Path("reports"), help="root of report folders")
    args = ap.parse_args(argv)
    try:
        if args.runs:
            run_dirs = [d for root in args.runs for d in record.find_runs(root)]
            name = args.name
        else:
            run_dirs, name = latest_runs(args.out_dir)
            name = args.name or name
        if not run_dirs:
            raise ValueError(f"no run.json under {[str(r) for r in args.runs or []]}")
        if not name:
            names = {
                record.read_json(d / "run.json").get("config", {}).get("bench", {}).get("report_name")
                for d in run_dirs
            }
            if len(names) != 1:
                raise ValueError(
                    f"runs have several bench.report_name values {sorted(map(str, names))}; pass --name"
                )
            name = names.pop()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    dest = args.reports / str(name)
    results, _ = collect(run_dirs, dest)
    print(terminal_table(results))
    print(f"== {len(results)} runs -> {dest / 'results.csv'}, {dest / 'steps.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
