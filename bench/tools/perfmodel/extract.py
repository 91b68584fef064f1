"""Write the performance model's data files (`bench.tools.perfmodel.calibration`) from report folders.

    python -m bench.tools.perfmodel.extract runs reports/<megatron report> \\
        bench/tools/perfmodel/data/<name>.json
    python -m bench.tools.perfmodel.extract kernels reports/<ns kernel report>/results.json \\
        bench/tools/perfmodel/data/ns_kernels_h200.json
    python -m bench.tools.perfmodel.extract committed bench/tools/perfmodel/data/gpu_runs.json \\
        reports/*/runs reports/megatron_h200_202611

Each file starts with its `provenance`: the source report, the last commit that changed it, the date and this
command.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RUN_CONFIG_KEYS = ("model", "parallelism", "optimizer", "hardware", "precision", "engine", "launcher")


def _last_commit(path: Path) -> str:
    """The last commit that changed `path` (the version of the report the data comes from)."""
    res = subprocess.run(
        ["git", "log", "-1", "--format=%h", "--", path.name],
        cwd=path.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    return res.stdout.strip() or "unknown"


def provenance(source: Path, argv: list[str]) -> dict[str, str]:
    """Where a data file came from: the source report, the commit it was read at, the date and the command."""
    return {
        "source": source.as_posix(),
        "commit": _last_commit(source),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "command": shlex.join(["python", "-m", "bench.tools.perfmodel.extract", *argv]),
    }


SUMMARY_KEYS = ("step_s_median", "optim_s_median", "ns_s_median", "fwd_bwd_s_median", "peak_mem_bytes")
"""What a data file keeps of a run's summary: what the performance model predicts (step, optimizer step, NS, peak)."""


def plan_times(plan: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The measured milliseconds of each NS plan entry's chosen method, by plan key (entries measured in the run,
    on a prior or adopted from a seed; fallbacks have none)."""
    out = {}
    for key, entry in sorted(plan.items()):
        ms = (entry.get("times_ms") or {}).get(entry.get("method"))
        if ms is not None and not entry.get("fallback"):
            out[key] = float(ms)
    return out


def extract_runs(report: Path, *more: Path) -> dict[str, Any]:
    """The successful H200 run records under `report` (and `more` folders): summary, engine, the resolved config
    once per hash."""
    runs: list[dict[str, Any]] = []
    configs: dict[str, dict[str, Any]] = {}
    paths = sorted({p for folder in (report, *more) for p in folder.glob("**/run.json")})
    for rec_path in paths:
        rec = json.loads(rec_path.read_text())
        cfg, summary = rec.get("config") or {}, rec.get("summary") or {}
        if rec.get("status") != "ok" or summary.get("step_s_median") is None:
            continue
        if (cfg.get("hardware") or {}).get("name") != "h200":
            continue
        key = str(rec.get("config_hash") or len(configs))
        configs.setdefault(key, {k: cfg[k] for k in (*RUN_CONFIG_KEYS, "experiment_name") if k in cfg})
        runs.append(
            {
                "run": f"{rec_path.parent.parent.name}/{rec_path.parent.name}",
                "git_sha": (rec.get("git") or {}).get("sha"),
                "config_hash": key,
                "summary": {k: summary.get(k) for k in SUMMARY_KEYS},
                "experts": str(((rec.get("worker") or {}).get("engine") or {}).get("experts", "")),
                "ns_plan_ms": plan_times(rec.get("ns_plan") or {}),
            }
        )
    return {"runs": runs, "configs": configs}


def _write(out: Path, body: dict[str, Any], source: Path, argv: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {"provenance": provenance(source, argv), **body}
    out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(
        prog="python -m bench.tools.perfmodel.extract", description=__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="kind", required=True)
    r = sub.add_parser("runs", help="successful H200 run records of a report folder -> a data file")
    r.add_argument("report", type=Path)
    r.add_argument("out", type=Path)
    c = sub.add_parser("committed", help="successful H200 run records of several folders -> one data file")
    c.add_argument("out", type=Path)
    c.add_argument("folders", type=Path, nargs="+")
    k = sub.add_parser("kernels", help="an NS kernel benchmark's results.json -> a data file")
    k.add_argument("results", type=Path)
    k.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    if args.kind == "runs":
        if not args.report.is_dir():
            ap.error(f"report: {args.report} is not a folder")
        body = extract_runs(args.report)
        if not body["runs"]:
            ap.error(f"report: no successful H200 run record under {args.report}")
        _write(args.out, body, args.report, argv)
    elif args.kind == "committed":
        missing = [str(f) for f in args.folders if not f.is_dir()]
        if missing:
            ap.error(f"folders: {missing} are not folders")
        body = extract_runs(*args.folders)
        _write(args.out, body, Path(os.path.commonpath(args.folders)), argv)
    else:
        if not args.results.is_file():
            ap.error(f"results: {args.results} does not exist")
        _write(args.out, json.loads(args.results.read_text()), args.results, argv)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
