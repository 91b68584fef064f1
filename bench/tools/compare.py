"""How much does a variant optimizer cost against a baseline, to a stated precision? (`muonbench compare`)

    muonbench compare experiment=h200/qwen3_30b_a3b_slice_short_megatron_1gpu [overrides ...]
        [--baseline adamw] [--variant muon] [--precision 0.005] [--budget-min 30] [--steady-steps 20]
        [--min-pairs 2] [--max-runs 16] [--out DIR]

Runs the workload that the overrides select (any `bench.run` override except the optimizer, the step count and the
output folder, which this command sets) with the baseline and the variant optimizer config, one run after another in
crossover order (A B B A A B ...), each its own `bench.run` process, until the 95% interval of the model-only ratio
has a half-width of at most `--precision` (0.005: +-0.5%), the time budget would be passed by one more run, or
`--max-runs` ran. It then prints "<variant> costs X% (95% interval A% to B%)" and a verdict only where the interval
supports one (`bench.results.intervals.verdict`); otherwise it says how wide the interval is and how many runs would
narrow it. `--baseline adamw --variant adamw` is the A/A check: its interval must hold 0.

The warm-up of each run is decided from its step times (`intervals.warmup_from_data`, never less than the
workload's `bench.warmup_steps`) and recorded. A run that did not end `ok` feeds nothing; the next run takes its
place in the order, and two failures in a row stop the comparison.

The folder (`--out`, default `<bench.out_dir>/compare/<workload>_<baseline>_vs_<variant>`) holds `compare.json`
(the plan and every run, so a second call with the same arguments resumes it), `runs/`, `results.csv` (one row per
step), `summary.json` and `compare.png`. Exit 0 when it stopped at the precision asked for, 1 when the budget or the
run limit stopped it first, 2 on bad input. Statistics and their validation: docs/compare.md.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.results import intervals
from bench.results.record import read_json, write_json_atomic
from bench.tools.project import prediction_of

OWN_KEYS = ("optimizer", "bench.steps", "bench.out_dir", "hydra.run.dir", "hydra.sweep.dir", "bench.resume")
"""Overrides this command sets itself."""
STEADY_MARGIN = 3
"""Steps run beyond warm-up + `--steady-steps`, for a warm-up the data finds longer than the configured one."""


class CompareError(ValueError):
    """Bad input: one line naming the argument, its value and what is allowed."""


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(
        prog="muonbench compare",
        description=__doc__.split("\n\n")[0],
        epilog="Remaining arguments are bench.run overrides (key=value) selecting the workload.",
    )
    ap.add_argument("--baseline", default="adamw", help="optimizer config of arm A (default adamw)")
    ap.add_argument("--variant", default="muon", help="optimizer config of arm B (default muon)")
    ap.add_argument("--precision", type=float, default=0.005, help="target half-width of the ratio's 95%% interval")
    ap.add_argument("--budget-min", type=float, default=30.0, help="wall-clock budget in minutes (default 30)")
    ap.add_argument("--steady-steps", type=int, default=20, help="steady steps per run (default 20)")
    ap.add_argument("--min-pairs", type=int, default=2, help="pairs before the stop rule applies (default 2)")
    ap.add_argument("--max-runs", type=int, default=16, help="most runs in all, resumed ones included (default 16)")
    ap.add_argument("--out", type=Path, default=None, help="the comparison's folder (resumed when it exists)")
    ap.add_argument("--analyze", action="store_true", help="only analyse the runs already in --out; launch none")
    args, rest = ap.parse_known_args(argv)
    for name, value, ok in (
        ("--precision", args.precision, math.isfinite(args.precision) and 0 < args.precision < 1),
        ("--budget-min", args.budget_min, math.isfinite(args.budget_min) and args.budget_min >= 0),
        ("--steady-steps", args.steady_steps, args.steady_steps >= 3),
        ("--min-pairs", args.min_pairs, args.min_pairs >= 2),
        ("--max-runs", args.max_runs, args.max_runs >= 2),
    ):
        if not ok:
            allowed = {
                "--precision": "a number in (0, 1)",
                "--budget-min": "a number >= 0",
                "--steady-steps": "an integer >= 3",
                "--min-pairs": "an integer >= 2 (one pair leaves no spread to estimate)",
                "--max-runs": "an integer >= 2",
            }[name]
            raise CompareError(f"{name}={value}: must be {allowed}")
    for arg in rest:
        if arg.startswith("-"):
            raise CompareError(f"{arg}: not an option of muonbench compare (see --help); overrides are key=value")
        key = arg.split("=", 1)[0].lstrip("+~")
        if "=" not in arg:
            raise CompareError(f"{arg!r}: overrides are key=value")
        if key in OWN_KEYS:
            raise CompareError(f"{key}: set by muonbench compare (use --baseline/--variant, --steady-steps, --out)")
    return args, rest


def plan(args: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    """Compose and check both arms' configs before anything runs; the comparison's plan (compare.json)."""
    import muonbench

    cfgs = {}
    for arm, opt in (("A", args.baseline), ("B", args.variant)):
        cfg = muonbench.load([*overrides, f"optimizer={opt}"])
        muonbench.check_runnable(cfg)
        if cfg.launcher.name != "local":
            raise CompareError(f"launcher={cfg.launcher.name}: compare runs its runs one after another here; allowed: local")
        cfgs[arm] = cfg
    a, b = cfgs["A"], cfgs["B"]
    workload = (a.experiment_name or a.model.name).replace("/", "_")
    warm = a.bench.warmup_steps
    return {
        "baseline": args.baseline,
        "variant": args.variant,
        "overrides": overrides,
        "precision": args.precision,
        "steady_steps": args.steady_steps,
        "steps_per_run": warm + args.steady_steps + STEADY_MARGIN,
        "configured_warmup": warm,
        "workload": workload,
        "model": a.model.name,
        "moe": a.model.num_experts > 0,
        "engine": a.engine.name,
        "world_size": a.parallelism.world_size,
        "out_dir": a.bench.out_dir,
        "runs": [],
        "variant_engine": b.engine.name,
        "predicted": predicted(cfgs),
    }


def predicted(cfgs: dict[str, Any]) -> dict[str, Any]:
    """Each arm's predicted step (`project.prediction_of`: interval, hardware profile), or why there is none."""
    out: dict[str, Any] = {}
    for arm, cfg in cfgs.items():
        try:
            out[arm] = prediction_of(cfg)
        except ValueError as exc:  # a hardware row the model does not price (cpu): the runs still compare
            out[arm] = {"none": str(exc)}
    return out


def _state_path(out: Path) -> Path:
    return out / "compare.json"


def open_state(out: Path, fresh: dict[str, Any]) -> dict[str, Any]:
    """The comparison in `out`: resumed when its compare.json has the same baseline, variant and overrides."""
    p = _state_path(out)
    if not p.exists():
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(p, fresh)
        return fresh
    old = read_json(p)
    for key in ("baseline", "variant", "overrides"):
        if old.get(key) != fresh[key]:
            raise CompareError(
                f"--out={out}: holds a comparison with {key}={old.get(key)!r}, not {fresh[key]!r}; "
                "choose another --out or repeat that comparison's arguments"
            )
    old.update(precision=fresh["precision"])
    return old


def next_arm(state: dict[str, Any]) -> str:
    """The arm of the next run: the crossover position counts the runs that ended ok (a failed run is redone)."""
    return intervals.crossover_arm(sum(1 for r in state["runs"] if r["status"] == "ok"))


def launch_one(state: dict[str, Any], out: Path) -> dict[str, Any]:
    """Run the next run through `bench.run` (its own process) and record it in the state."""
    arm = next_arm(state)
    opt = state["baseline"] if arm == "A" else state["variant"]
    name = f"{len(state['runs']) + 1:02d}_{arm}_{opt}"
    run_dir = out / "runs" / name
    cmd = [
        sys.executable,
        "-m",
        "bench.run",
        *state["overrides"],
        f"optimizer={opt}",
        f"bench.steps={state['steps_per_run']}",
        f"bench.out_dir={out / 'runs'}",
        f"hydra.run.dir={run_dir}",
    ]
    print(f"== compare: run {len(state['runs']) + 1} ({arm}: {opt})", flush=True)
    t0 = time.time()
    rc = subprocess.call(cmd)
    seconds = time.time() - t0
    status = "error"
    if (run_dir / "run.json").exists():
        status = read_json(run_dir / "run.json").get("status", "error")
    entry = {"dir": f"runs/{name}", "arm": arm, "optimizer": opt, "status": status, "returncode": rc,
             "seconds": round(seconds, 1), "started": t0}  # fmt: skip
    state["runs"].append(entry)
    write_json_atomic(_state_path(out), state)
    return entry


# ---------------------------------------------------------------------------------------------------------- analysis


def load_run(out: Path, entry: dict[str, Any], configured_warmup: int) -> dict[str, Any] | None:
    """One ok run's steps, its warm-up decided from its step times, and its steady steps."""
    d = out / entry["dir"]
    rec = read_json(d / "run.json")
    if rec.get("status") != "ok":
        return None
    steps = [json.loads(line) for line in (d / "steps.jsonl").read_text().splitlines() if line.strip()]
    steps = [s for s in steps if s.get("step_s") is not None]
    times = [s["step_s"] for s in steps]
    warm = intervals.warmup_from_data(times, floor=configured_warmup)
    worker = rec.get("worker") or {}
    return {
        **entry,
        "run_id": rec.get("run_id", d.name),
        "gpu": worker.get("gpu_name") or "cpu",
        "peak_mem_bytes": (rec.get("summary") or {}).get("peak_mem_bytes"),
        "warmup": warm,
        "steps": steps,
        "steady": steps[warm:],
    }


def _stat(run: dict[str, Any], field: str) -> float:
    return intervals.run_statistic([s[field] for s in run["steady"]])


def _median(runs: list[dict[str, Any]], field: str) -> float:
    import numpy as np

    vals = [s[field] for r in runs for s in r["steady"] if s.get(field) is not None]
    return float(np.median(vals)) if vals else math.nan


def _arm_spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm's spread: the range of its steady step times, of its runs' medians (step time, SM clock, power), and
    the largest run median over the smallest less one."""
    import numpy as np

    def run_medians(field: str) -> list[float]:
        vals = [_median([r], field) for r in runs]
        vals = [v for v in vals if math.isfinite(v)]
        return [min(vals), max(vals)] if vals else []

    steps = [s["step_s"] for r in runs for s in r["steady"]]
    meds = run_medians("step_s")
    return {
        "step_s_steady": [float(np.min(steps)), float(np.max(steps))],
        "step_s_run_medians": meds,
        "run_median_spread": meds[1] / meds[0] - 1,
        "sm_mhz_run_medians": run_medians("sm_mhz"),
        "power_w_run_medians": run_medians("power_w"),
        "sm_mhz_median": _median(runs, "sm_mhz"),
    }


def analyze(state: dict[str, Any], out: Path) -> dict[str, Any] | None:
    """The comparison so far (None before one ok run of each arm)."""
    runs = [r for e in state["runs"] if (r := load_run(out, e, state["configured_warmup"])) is not None]
    arms = {a: [r for r in runs if r["arm"] == a] for a in "AB"}
    if not arms["A"] or not arms["B"]:
        return None
    step = intervals.compare([_stat(r, "step_s") for r in arms["A"]], [_stat(r, "step_s") for r in arms["B"]])
    fwd = intervals.compare([_stat(r, "fwd_bwd_s") for r in arms["A"]], [_stat(r, "fwd_bwd_s") for r in arms["B"]])
    optim = {a: _median(arms[a], "optim_s") for a in "AB"}
    optim_cost = (optim["B"] - optim["A"]) / _median(arms["B"], "step_s")
    import numpy as np

    within = [float(np.std(np.log([s["step_s"] for s in r["steady"]]), ddof=1)) for r in runs if len(r["steady"]) > 1]
    text = intervals.verdict(
        step, precision=state["precision"], variant=state["variant"], baseline=state["baseline"], fwd_bwd=fwd,
        optim_cost=optim_cost,
    )  # fmt: skip
    gpus = sorted({r["gpu"] for r in runs})
    return {
        "model": state["model"],
        "moe": state["moe"],
        "engine": state["engine"],
        "baseline": state["baseline"],
        "variant": state["variant"],
        "ratio": step.ratio,
        "ci95": list(step.ci95),
        "cost": step.cost,
        "cost_ci95": list(step.cost_ci95),
        "half_width": step.half_width,
        "precision": state["precision"],
        "runs": len(runs),
        "runs_per_arm": {"A": len(arms["A"]), "B": len(arms["B"])},
        "steady_steps_per_run": min(len(r["steady"]) for r in runs),
        "gpu": gpus[0] if len(gpus) == 1 else gpus,
        "gpu_minutes": round(sum(e["seconds"] for e in state["runs"]) * state["world_size"] / 60, 2),
        "verdict": text,
        "sd_between_runs": step.sd_between,
        "sd_within_run_median": float(np.median(within)) if within else math.nan,
        "fwd_bwd": {"ratio": fwd.ratio, "ci95": list(fwd.ci95), "half_width": fwd.half_width},
        "optim_s_median": {state["baseline"]: optim["A"], state["variant"]: optim["B"]},
        "optim_cost": optim_cost,
        "peak_mem_bytes": {
            state["baseline"]: max((r["peak_mem_bytes"] or 0) for r in arms["A"]),
            state["variant"]: max((r["peak_mem_bytes"] or 0) for r in arms["B"]),
        },
        "mem_end_bytes_median": {
            state["baseline"]: _median(arms["A"], "mem_end_bytes"),
            state["variant"]: _median(arms["B"], "mem_end_bytes"),
        },
        "by_arm": {a: _arm_spread(arms[a]) for a in "AB"},  # A: the baseline, B: the variant
        "order": " ".join(r["arm"] for r in runs),
        "failed_runs": [e["dir"] for e in state["runs"] if e["status"] != "ok"],
        "per_run": [
            {
                "dir": r["dir"],
                "arm": r["arm"],
                "optimizer": r["optimizer"],
                "warmup_steps": r["warmup"],
                "steady_steps": len(r["steady"]),
                "step_s_median": float(np.median([s["step_s"] for s in r["steady"]])),
                "fwd_bwd_s_median": float(np.median([s["fwd_bwd_s"] for s in r["steady"]])),
                "throttled_steps": sum(1 for s in r["steady"] if intervals.throttled(s.get("throttle_reasons"))),
                "sm_mhz_median": _median([r], "sm_mhz"),
                "power_w_median": _median([r], "power_w"),
                "cpu_s_median": _median([r], "cpu_s"),
                "alloc_retries": r["steps"][-1].get("alloc_retries"),
            }
            for r in runs
        ],
        "_runs": runs,
    }


def write_outputs(summary: dict[str, Any], out: Path) -> None:
    """results.csv (one row per step, warm-up flagged as decided), summary.json and compare.png."""
    import pandas as pd

    runs = summary.pop("_runs")
    rows = []
    for pos, r in enumerate(runs, 1):
        for i, s in enumerate(r["steps"]):
            rows.append({"position": pos, "run": r["dir"], "arm": r["arm"], "optimizer": r["optimizer"],
                         "warmup": i < r["warmup"], **{k: v for k, v in s.items() if k != "warmup"}})  # fmt: skip
    pd.DataFrame(rows).to_csv(out / "results.csv", index=False)
    write_json_atomic(out / "summary.json", summary)
    plot(runs, summary, out / "compare.png")


def plot(runs: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    colors = {"A": "tab:gray", "B": "tab:blue"}
    x0 = 0
    for r in runs:
        xs = list(range(x0, x0 + len(r["steps"])))
        t = [s["step_s"] for s in r["steps"]]
        axes[0].plot(xs[: r["warmup"]], t[: r["warmup"]], "x", color=colors[r["arm"]], alpha=0.4)
        axes[0].plot(xs[r["warmup"] :], t[r["warmup"] :], ".", color=colors[r["arm"]])
        clk = [s.get("sm_mhz") for s in r["steps"]]
        if any(c is not None for c in clk):
            axes[1].plot(xs, [math.nan if c is None else c for c in clk], ".", color=colors[r["arm"]])
        thr = [x for x, s in zip(xs, r["steps"], strict=True) if intervals.throttled(s.get("throttle_reasons"))]
        for x in thr:
            axes[0].axvline(x, color="tab:red", alpha=0.2)
        x0 += len(r["steps"]) + 2
    steady = [s["step_s"] for r in runs for s in r["steady"]]
    axes[0].set_ylim(0.97 * min(steady), 1.03 * max(steady))  # warm-up steps above it are off the scale
    lo, hi = summary["cost_ci95"]
    axes[0].set_title(
        f"{summary['model']} ({summary['engine']}): {summary['variant']} (blue) vs {summary['baseline']} (grey); "
        f"cost {100 * summary['cost']:+.2f}% [{100 * lo:+.2f}, {100 * hi:+.2f}]",
        fontsize=10,
    )
    axes[0].set_ylabel("step time (s)\nx = warm-up (may be off scale)")
    axes[1].set_ylabel("SM clock (MHz)")
    axes[1].set_xlabel("steps of each run, runs in the order they ran (red: a thermal or hardware slowdown)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def headline(summary: dict[str, Any]) -> str:
    return (
        f"{summary['verdict']}\n"
        f"   {summary['runs']} runs ({summary['order']}), >= {summary['steady_steps_per_run']} steady steps each, "
        f"{summary['gpu']}, {summary['gpu_minutes']} GPU-minutes; ratio {summary['ratio']:.4f} "
        f"({summary['ci95'][0]:.4f}-{summary['ci95'][1]:.4f}); forward-backward ratio "
        f"{summary['fwd_bwd']['ratio']:.4f} ({summary['fwd_bwd']['ci95'][0]:.4f}-{summary['fwd_bwd']['ci95'][1]:.4f})"
    )


def progress(summary: dict[str, Any] | None, args: argparse.Namespace, elapsed_s: float) -> str:
    """One line after each run: the ratio and its interval so far against the target, and the budget used."""
    used = f"{elapsed_s / 60:.1f} of {args.budget_min:g} min"
    if summary is None or not math.isfinite(summary["half_width"]):
        return f"== compare: no interval yet (two runs of each arm needed); {used}"
    lo, hi = summary["ci95"]
    return (
        f"== compare: ratio {summary['ratio']:.4f} ({lo:.4f}-{hi:.4f}), half-width {summary['half_width']:.4f} "
        f"against {args.precision:g}; {summary['runs']} runs; {used}"
    )


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    try:
        fresh = plan(args, overrides)
    except ValueError as exc:  # the config's own errors (muonbench.ConfigError and kin): one line naming the field
        raise CompareError(str(exc)) from exc
    out = args.out or Path(fresh["out_dir"]) / "compare" / f"{fresh['workload']}_{args.baseline}_vs_{args.variant}"
    if args.analyze and not _state_path(out).exists():
        raise CompareError(f"--analyze: {out} holds no comparison (no compare.json)")
    state = open_state(out, fresh)
    t_start = time.time()
    budget_s = args.budget_min * 60
    reason = "analysis only"
    failures = 0
    summary = analyze(state, out)  # after every run, then read by the stop rule, the progress line and the outputs
    while not args.analyze:
        ok = [e for e in state["runs"] if e["status"] == "ok"]
        arms_ok = {a: sum(1 for e in ok if e["arm"] == a) for a in "AB"}
        if (
            summary is not None
            and len(ok) % 2 == 0
            and min(arms_ok.values()) >= args.min_pairs
            and summary["half_width"] <= args.precision
        ):
            reason = "precision reached"
            break
        if len(state["runs"]) >= args.max_runs:
            reason = f"--max-runs={args.max_runs} reached"
            break
        durations = [e["seconds"] for e in state["runs"]]
        expected = sum(durations) / len(durations) if durations else 0.0
        if time.time() - t_start + expected > budget_s:
            reason = f"--budget-min={args.budget_min:g} would be passed by one more run"
            break
        entry = launch_one(state, out)
        failures = failures + 1 if entry["status"] != "ok" else 0
        summary = analyze(state, out)
        if failures >= 2:
            reason = "two runs in a row did not end ok"
            print(f"error: {reason}: see {out / entry['dir']}", file=sys.stderr)
            break
        print(progress(summary, args, time.time() - t_start), flush=True)
    if summary is None:
        print(f"no comparison yet: {out} has no ok run of each arm ({reason})", file=sys.stderr)
        return 1
    summary["stop_reason"] = reason
    state["stop_reason"] = reason
    write_json_atomic(_state_path(out), state)
    summary["predicted"] = state.get("predicted", {})
    write_outputs(summary, out)
    print(headline(summary))
    print(f"   stopped: {reason}; {out}/summary.json")
    return 0 if summary["half_width"] <= args.precision and summary["runs_per_arm"]["A"] >= 2 else 1


def main(argv: list[str] | None = None) -> int:
    try:
        args, overrides = parse(list(sys.argv[1:] if argv is None else argv))
        return run(args, overrides)
    except CompareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
