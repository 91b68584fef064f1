"""Collect run records into one tidy table: one row per run (config keys + summary metrics + provenance).

    python -m bench.results.collect                       # the latest `bench.run` invocation -> <its sweep dir>/report/
    python -m bench.results.collect --runs runs/ --name my_study      # -> reports/my_study/

Writes `results.csv` (one row per run), `steps.csv` (one row per run and step, the loss and time curves the
report plots) and `run.json` (the report's provenance: for every run its status, commit, versions, host, command
and times; the commits, hosts and version sets the report spans; the command that collected it and when). By
default, for the invocation `<out-dir>/LATEST.json` names, into `<sweep dir>/report/` (a single run:
`<run dir>/report/`), where git does not track; with `--name`, `--runs` or `--reports` into
`<reports>/<name>/`. Failed runs are rows too, with their status and error, so a sweep never silently shrinks. A
broken record (unreadable or missing `run.json`, a bad line in `steps.jsonl`) is skipped alone and named with its
file and line in a warning; `--strict` makes any of them an error (exit 1, nothing written). No torch import.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from bench import metrics
from bench.results import record
from muonbench.cli_help import command

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
    "layers": "engine.layers",
    "moe_permute_fusion": "engine.moe_permute_fusion",
    "apply_rope_fusion": "engine.apply_rope_fusion",
    "moe_router_fusion": "engine.moe_router_fusion",
    "moe_router_dtype": "engine.moe_router_dtype",
    "grad_reduce_in_fp32": "engine.grad_reduce_in_fp32",
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
    div = rec.get("divergence") or {}
    choices = rec.get("choices") or {}
    overrides = rec.get("overrides") or []
    chosen = [o.split("=", 1)[1] for o in overrides if o.startswith("optimizer=") and "," not in o]
    row: dict[str, Any] = {
        "run_id": rec.get("run_id"),
        "status": rec.get("status"),
        "error_type": err.get("type"),
        "error_message": (str(err["message"])[:300] if err.get("message") else None),
        "diverged_at_step": div.get("step"),
        "diverged_loss": div.get("loss"),
        "diverged_reason": div.get("reason"),
        "optimizer_config": choices.get("optimizer") or (chosen[0] if chosen else None),
        "overrides": " ".join(overrides),
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


def step_rows(rec: dict[str, Any], run_dir: Path, problems: list[str]) -> list[dict[str, Any]]:
    """The steps.csv rows of one run (run id and optimizer in front of every steps.jsonl line)."""
    opt = _get(rec.get("config") or {}, "optimizer.name")
    steps = record.read_steps(run_dir, problems=problems)
    if not steps and rec.get("status") == record.Status.OK:
        why = "empty" if (run_dir / "steps.jsonl").exists() else "missing"
        problems.append(f"{run_dir / 'steps.jsonl'}: {why} for a run recorded ok; its row kept, no step rows")
    return [{"run_id": rec.get("run_id"), "optimizer": opt, **s} for s in steps]


def latest_runs(out_dir: Path) -> tuple[list[Path], dict[str, Any]]:
    """Run directories and manifest of the latest `bench.run` invocation."""
    manifest = out_dir / "LATEST.json"
    if not manifest.exists():
        raise ValueError(f"{manifest} does not exist: run `{command('bench.run')}` first, or pass --runs DIR")
    data = record.read_json(manifest)
    return [Path(p) for p in data["runs"]], data


def default_report_dir(manifest: dict[str, Any]) -> Path:
    """Where the report of an invocation goes by default: `<sweep dir>/report/`, or `<run dir>/report/`."""
    if manifest.get("sweep_dir"):
        return Path(manifest["sweep_dir"]) / "report"
    if manifest.get("runs"):
        return Path(manifest["runs"][0]) / "report"
    raise ValueError("LATEST.json lists no runs yet: its invocation has not started a job")


def read_records(run_dirs: list[Path], problems: list[str]) -> list[tuple[Path, dict[str, Any]]]:
    """(run dir, run.json) of every readable record; each missing or unreadable one named in `problems`."""
    out = []
    for d in run_dirs:
        path = d / "run.json"
        if path.exists() and not path.is_file():  # a directory; a FIFO would block the read
            problems.append(f"{path}: not a regular file; run skipped")
            continue
        try:
            rec = record.read_json(path)
        except FileNotFoundError:
            problems.append(f"{path}: missing; run skipped")
            continue
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{path}: unreadable ({exc}); run skipped")
            continue
        except json.JSONDecodeError as exc:
            problems.append(
                f"{path}:{exc.lineno}: unreadable JSON ({exc.msg}, column {exc.colno}); run skipped"
            )
            continue
        if not isinstance(rec, dict):
            problems.append(f"{path}: not a JSON object; run skipped")
            continue
        out.append((d, rec))
    return out


REPORT_SCHEMA = "muonbench.report/1"


def provenance(
    records: list[dict[str, Any]],
    *,
    command: list[str],
    skipped: list[str],
    git: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report's `run.json`: each run's provenance, and what the report spans (commits, hosts, versions).
    `git`: the collecting tree's state (default: read now)."""

    def host(rec: dict[str, Any]) -> str:
        hw = rec.get("hardware") or {}
        gpu = f"{hw.get('gpu_count')} x {hw['gpu_name']}" if hw.get("gpu_name") else "no GPU"
        return f"{hw.get('hostname')} ({hw.get('cpu_count')} x {hw.get('cpu_model')}; {gpu})"

    runs = [
        {
            "run_id": rec.get("run_id"),
            "status": rec.get("status"),
            "start_time": rec.get("start_time"),
            "end_time": rec.get("end_time"),
            "duration_s": rec.get("duration_s"),
            "git": rec.get("git"),
            "host": host(rec),
            "hardware": rec.get("hardware"),
            "versions": rec.get("versions"),
            "command": " ".join(rec.get("command") or []),
            "overrides": rec.get("overrides"),
        }
        for rec in records
    ]
    version_sets = []
    for rec in records:
        if (v := rec.get("versions")) not in version_sets:
            version_sets.append(v)
    return {
        "schema": REPORT_SCHEMA,
        "collected": record.now_iso(),
        "collected_by": " ".join(command),
        "collected_at_git": git if git is not None else record.git_info(),
        "commits": sorted({str((r.get("git") or {}).get("sha")) for r in records}),
        "hosts": sorted({host(r) for r in records}),
        "versions": version_sets[0] if len(version_sets) == 1 else version_sets,
        "runs": runs,
        "skipped_records": skipped,
    }


class BrokenRecords(ValueError):
    """`--strict` and some run record could not be read whole."""


def collect(
    run_dirs: list[Path],
    dest: Path,
    *,
    problems: list[str] | None = None,
    strict: bool = False,
    command: list[str] | None = None,
) -> tuple[Any, Any]:
    """Write `dest/results.csv`, `dest/steps.csv` and `dest/run.json` (`provenance`; `command`: what collected,
    default this process's sys.argv); returns the two DataFrames. Broken records are skipped and named in
    `problems` (warned when None) and in run.json; `strict` raises ValueError listing them instead."""
    import pandas as pd

    git = record.git_info()  # before this report's own files change the tree
    found: list[str] = []
    rows, steps, recs = [], [], []
    for d, rec in read_records(run_dirs, found):
        try:
            row, step = run_row(rec), step_rows(rec, d, found)
        except (TypeError, AttributeError, ValueError, KeyError) as exc:  # a field of the wrong type
            found.append(f"{d / 'run.json'}: a field has the wrong type ({type(exc).__name__}: {exc}); run skipped")
            continue
        rows.append(row)
        steps.extend(step)
        recs.append(rec)
    if strict and found:
        raise BrokenRecords("broken run records (--strict):\n  " + "\n  ".join(found))
    if problems is None:
        for msg in found:
            warnings.warn(msg, record.RecordWarning, stacklevel=2)
    else:
        problems.extend(found)
    results = pd.DataFrame(rows)
    step_df = pd.DataFrame(steps, columns=["run_id", "optimizer", *metrics.step_keys()])
    dest.mkdir(parents=True, exist_ok=True)
    results.to_csv(dest / "results.csv", index=False)
    step_df.to_csv(dest / "steps.csv", index=False)
    argv = command if command is not None else sys.argv
    record.write_json_atomic(dest / "run.json", provenance(recs, command=argv, skipped=found, git=git))
    return results, step_df


def terminal_table(results: Any) -> str:
    """A short fixed-width table of the collected runs."""
    cols = [
        "run_id",
        "optimizer_config",
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


def check_command(manifest: dict[str, Any], expected: str, path: Path) -> None:
    """ValueError unless the invocation of `manifest` completed and ran exactly `bench.run <expected>`: a committed
    example report is rewritten only from the sweep it shows."""
    import shlex

    ran = [a for a in manifest.get("argv") or [] if not a.startswith("bench.resume=")]
    if ran != shlex.split(expected) or manifest.get("state") != "complete":
        raise ValueError(
            f"{path}: the latest invocation ({manifest.get('state')}) ran `{command('bench.run')} {shlex.join(ran)}`; "
            f"this report is made only from a complete `{command('bench.run')} {expected}`"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=command("bench.results.collect"), description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--runs", nargs="*", type=Path, help="run directories or roots to search (default: latest invocation)"
    )
    ap.add_argument("--out-dir", type=Path, default=Path("runs"), help="bench.out_dir holding LATEST.json")
    ap.add_argument(
        "--name", help="report name: write <reports>/<name>/ (default: bench.report_name of the runs)"
    )
    ap.add_argument("--reports", type=Path, help="root of named report folders (default: reports)")
    ap.add_argument(
        "--strict", action="store_true", help="a broken record is an error (exit 1), not a warning"
    )
    ap.add_argument(
        "--expect-command",
        metavar="ARGS",
        help=f"refuse unless the latest invocation completed exactly `{command('bench.run')} ARGS` (make bench-example)",
    )
    args = ap.parse_args(argv)
    problems: list[str] = []
    try:
        manifest: dict[str, Any] = {}
        if args.runs:
            run_dirs = [d for root in args.runs for d in record.find_runs(root)]
        else:
            run_dirs, manifest = latest_runs(args.out_dir)
            if args.expect_command is not None:
                check_command(manifest, args.expect_command, args.out_dir / "LATEST.json")
            if manifest.get("state") in ("running", "interrupted", "killed"):
                problems.append(
                    f"{args.out_dir / 'LATEST.json'}: its invocation is {manifest['state']} "
                    f"({record.count(len(run_dirs), 'run')} recorded so far)"
                )
        if not run_dirs:
            raise ValueError(f"no run.json under {[str(r) for r in args.runs or []]}")
        named = bool(args.runs or args.name or args.reports)
        if named:
            name = args.name or manifest.get("report_name")
            if not name:
                names = {
                    (rec.get("config") or {}).get("bench", {}).get("report_name")
                    for _, rec in read_records(run_dirs, [])
                }
                if len(names) != 1:
                    raise ValueError(
                        f"runs have several bench.report_name values {sorted(map(str, names))}; pass --name"
                    )
                name = names.pop()
            dest = (args.reports or Path("reports")) / str(name)
        else:
            dest = default_report_dir(manifest)
        if args.strict and problems:
            raise BrokenRecords("--strict: " + "; ".join(problems))
        cmd = ["python", "-m", "bench.results.collect", *(sys.argv[1:] if argv is None else argv)]
        results, _ = collect(run_dirs, dest, problems=problems, strict=args.strict, command=cmd)
    except BrokenRecords as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for msg in problems:
        print(f"warning: {msg}", file=sys.stderr)
    print(terminal_table(results))
    print(f"== {record.count(len(results), 'run')} -> {dest / 'results.csv'}, {dest / 'steps.csv'}, {dest / 'run.json'}")
    return 0


if __name__ == "__main__":
    from bench import entry

    raise SystemExit(entry.run(main))
