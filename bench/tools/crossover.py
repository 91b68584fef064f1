"""Crossover comparison of two optimizers from run records: step, forward-backward and optimizer-step medians and the
model-only ratio with its 95% interval (`bench.results.intervals`).

    python -m bench.tools.crossover RUNS_DIR [--baseline adamw] [--out DIR]

RUNS_DIR holds one folder per run (`run.json` + `steps.jsonl`, as `bench.run` writes them), all of one workload, run
one after another on one host in crossover order (A B B A A B ...). Only runs that ended `ok` count; steady steps are
those the run's protocol did not mark as warm-up. The ratio is baseline step time over variant step time (the
variant's model TF/s over the baseline's: both do the same model FLOPs); its interval is Student's t on the runs'
median log step times, so the spread between runs is in it (docs/compare.md). `muonbench compare` runs such a
sequence itself until the interval is as narrow as asked.
Writes `results.csv` (one row per steady step), `summary.json` and `crossover.png` to --out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.entry import ArgParser
from bench.results import intervals
from bench.results.record import first_step
from muonbench.cli_help import command

FIELDS = ("step_s", "fwd_bwd_s", "optim_s")


def load_runs(root: Path) -> list[dict[str, Any]]:
    """The `ok` runs under root in start order: optimizer, start time, load average, first step and steady steps."""
    if not root.is_dir():
        raise ValueError(f"{root}: not a folder of run folders")
    runs = []
    for rj in sorted(root.rglob("run.json")):  # run folders directly under root or a level or more down
        try:
            run = _ok_run(rj)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{rj}: not a readable run record ({type(exc).__name__}: {exc})") from None
        if run is not None:
            runs.append(run)
    return sorted(runs, key=lambda r: r["start_time"])


def _ok_run(rj: Path) -> dict[str, Any] | None:
    rec = json.loads(rj.read_text())
    if rec.get("status") != "ok":
        return None
    warm = int(rec["config"]["bench"]["warmup_steps"])
    steps = [json.loads(line) for line in (rj.parent / "steps.jsonl").read_text().splitlines() if line.strip()]
    return {
        "run_id": rec["run_id"],
        "optimizer": rec["config"]["optimizer"]["name"],
        "start_time": rec["start_time"],
        "load_avg_1m": (rec.get("hardware") or {}).get("load_avg_1m"),
        **first_step(steps),
        "peak_mem_bytes": (rec.get("summary") or {}).get("peak_mem_bytes"),
        "steady": [s for s in steps[warm:] if s.get("step_s") is not None],
    }


def _median(runs: list[dict[str, Any]], field: str) -> float:
    return float(np.median([s[field] for r in runs for s in r["steady"]]))


def _iqr(runs: list[dict[str, Any]], field: str) -> float:
    q1, q3 = np.percentile([s[field] for r in runs for s in r["steady"]], [25, 75])
    return float(q3 - q1)


def interval(base: list[dict[str, Any]], var: list[dict[str, Any]], field: str = "step_s") -> tuple[float, float]:
    """95% interval of the baseline / variant ratio of `field` from the runs' statistics (t on run medians,
    `intervals.compare`: the spread between runs is in it); (nan, nan) with fewer than two runs in an arm."""
    def stat(runs: list[dict[str, Any]]) -> list[float]:
        return [intervals.run_statistic([s[field] for s in r["steady"]]) for r in runs]

    return intervals.compare(stat(base), stat(var)).ci95


def pair_ratios(runs: list[dict[str, Any]], baseline: str) -> list[float]:
    """Model-only ratio of each adjacent pair (runs 1-2, 3-4, ...) that holds one run of each optimizer: the
    comparison least exposed to a host that drifts during the sequence."""
    out = []
    for a, b in zip(runs[::2], runs[1::2], strict=False):
        if (a["optimizer"] == baseline) == (b["optimizer"] == baseline):
            continue
        base, var = (a, b) if a["optimizer"] == baseline else (b, a)
        out.append(_median([base], "step_s") / _median([var], "step_s"))
    return out


def summarize(runs: list[dict[str, Any]], baseline: str) -> dict[str, Any]:
    names = sorted({r["optimizer"] for r in runs})
    if baseline not in names or len(names) != 2:
        raise ValueError(f"--baseline={baseline!r}: need exactly two optimizers, one of them the baseline; found {names}")
    variant = next(n for n in names if n != baseline)
    arms = {n: [r for r in runs if r["optimizer"] == n] for n in names}
    out: dict[str, Any] = {
        "order": " ".join("A" if r["optimizer"] == baseline else "B" for r in runs),
        "baseline": baseline,
        "variant": variant,
        "runs": {n: len(a) for n, a in arms.items()},
        "steady_steps": {n: sum(len(r["steady"]) for r in a) for n, a in arms.items()},
        "load_avg_1m_at_start": [r["load_avg_1m"] for r in runs],
    }
    for n, a in arms.items():
        for f in FIELDS:
            out[f"{n}_{f}_median"] = _median(a, f)
            out[f"{n}_{f}_iqr"] = _iqr(a, f)
        out[f"{n}_first_step_s"] = [r["first_step_s"] for r in a]
        out[f"{n}_first_optim_s"] = [r["first_optim_s"] for r in a]
        out[f"{n}_peak_mem_bytes"] = max(r["peak_mem_bytes"] or 0 for r in a)
    out["ratio_model_only"] = out[f"{baseline}_step_s_median"] / out[f"{variant}_step_s_median"]
    out["ratio_model_only_ci95"] = interval(arms[baseline], arms[variant])
    out["fwd_bwd_ratio"] = out[f"{baseline}_fwd_bwd_s_median"] / out[f"{variant}_fwd_bwd_s_median"]
    out["fwd_bwd_ratio_ci95"] = interval(arms[baseline], arms[variant], "fwd_bwd_s")
    out["pair_ratios"] = pair_ratios(runs, baseline)
    out["optimizer_step_only_ratio"] = (out[f"{baseline}_fwd_bwd_s_median"] + out[f"{baseline}_optim_s_median"]) / (
        out[f"{baseline}_fwd_bwd_s_median"] + out[f"{variant}_optim_s_median"]
    )
    out["no_interval"] = {
        "optimizer_step_only_ratio": "an estimate from medians, the baseline's forward-backward plus each optimizer step"
    }
    return out


def write(runs: list[dict[str, Any]], summary: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    lines = ["position,run_id,optimizer,load_avg_1m,step,step_s,fwd_bwd_s,optim_s"]
    for i, r in enumerate(runs, 1):
        for s in r["steady"]:
            lines.append(
                f"{i},{r['run_id']},{r['optimizer']},{r['load_avg_1m']},{s['step']},"
                + ",".join(f"{s[f]:.6f}" for f in FIELDS)
            )
    (out / "results.csv").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    colors = {summary["baseline"]: "tab:gray", summary["variant"]: "tab:blue"}
    for i, r in enumerate(runs, 1):
        xs = [i + 0.12 * (j - (len(r["steady"]) - 1) / 2) for j in range(len(r["steady"]))]
        for ax, f in ((ax1, "fwd_bwd_s"), (ax2, "optim_s")):
            ax.scatter(xs, [s[f] for s in r["steady"]], color=colors[r["optimizer"]], s=18)
    for ax, title in ((ax1, "forward-backward per steady step (s)"), (ax2, "optimizer step per steady step (s)")):
        ax.set_xticks(range(1, len(runs) + 1), [f"{i}\n{r['optimizer']}" for i, r in enumerate(runs, 1)])
        ax.set_xlabel("run, in the order they ran")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "crossover.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = ArgParser(prog=command("bench.tools.crossover"), description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, help="folder of run folders (run.json + steps.jsonl)")
    ap.add_argument("--baseline", default="adamw", help="the optimizer in the denominator of the step time")
    ap.add_argument("--out", type=Path, default=None, help="where to write results.csv/summary.json/png")
    args = ap.parse_args(argv)
    try:
        runs = load_runs(args.runs)
        if not runs:
            raise ValueError(f"no ok run under {args.runs}")
        summary = summarize(runs, args.baseline)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write(runs, summary, args.out or args.runs)
    lo, hi = summary["ratio_model_only_ci95"]
    print(f"order {summary['order']} (A={summary['baseline']}, B={summary['variant']})")
    for n in (summary["baseline"], summary["variant"]):
        print(
            f"{n}: step {summary[f'{n}_step_s_median']:.3f} s (IQR {summary[f'{n}_step_s_iqr']:.3f}), fwd_bwd "
            f"{summary[f'{n}_fwd_bwd_s_median']:.3f} s, optimizer {summary[f'{n}_optim_s_median'] * 1e3:.0f} ms"
        )
    print(f"model-only ratio {summary['variant']}/{summary['baseline']}: {summary['ratio_model_only']:.3f} "
          f"(95% interval {lo:.3f}-{hi:.3f})")
    flo, fhi = summary["fwd_bwd_ratio_ci95"]
    print(f"forward-backward ratio {summary['fwd_bwd_ratio']:.3f} (95% interval {flo:.3f}-{fhi:.3f}); "
          f"per pair: {', '.join(f'{x:.3f}' for x in summary['pair_ratios']) or 'no full pair'}")
    return 0


if __name__ == "__main__":
    from bench import entry

    raise SystemExit(entry.run(main))
