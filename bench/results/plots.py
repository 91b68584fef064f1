"""The report's figures, drawn from the collected rows and steps (never from live processes).

- `tflops_figure`: model TFLOP/s and Newton-Schulz TFLOP/s per GPU as two bars side by side per run (never stacked,
  never added: a stacked bar makes the slower optimizer look faster).
- `breakdown_figure`: stacked step-time parts per run, legend outside the axes.
- `curves_figure`: a per-step curve per run, each with its own line style and marker so overlapping curves stay
  distinguishable; a run that diverged ends in an `x` at its first non-finite step, with a dotted vertical line.

Each returns a matplotlib Figure; `save` writes and closes it. matplotlib with the Agg backend; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ("-", "v"), ("--", "P"), (":", "X"), ("-.", "*"))
"""(line style, marker) per curve, in order; colors cycle separately, so no two of the first 8 look alike."""


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _figure(width: float = 7.0) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, 4), dpi=100)


def save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def tflops_figure(rows: list[dict[str, Any]], label: Callable[[dict[str, Any]], str]) -> Any:
    """Grouped bars: model TFLOP/s (Megatron formula) and NS TFLOP/s (plain count) per GPU, side by side."""
    labels = [label(r) for r in rows]
    model = [_num(r.get("model_tflops_per_gpu")) or 0.0 for r in rows]
    ns = [_num(r.get("ns_tflops_per_gpu")) or 0.0 for r in rows]
    fig, ax = _figure()
    xs = range(len(rows))
    width = 0.38
    bars_m = ax.bar(
        [x - width / 2 for x in xs], model, width, label="model (Megatron formula)", color="tab:blue"
    )
    bars_n = ax.bar(
        [x + width / 2 for x in xs], ns, width, label="Newton-Schulz (plain count)", color="tab:orange"
    )
    ax.bar_label(bars_m, fmt="%.3g", fontsize=7)
    ax.bar_label(bars_n, fmt="%.3g", fontsize=7)
    ax.set_xticks(
        list(xs), labels, rotation=20 if len(rows) > 3 else 0, ha="right" if len(rows) > 3 else "center"
    )
    ax.set_ylabel("TFLOP/s per GPU")
    ax.set_title("Model and Newton-Schulz TFLOP/s per GPU (separate, not added)")
    ax.margins(y=0.15)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


BREAKDOWN_PARTS = (
    "forward+backward",
    "communication",
    "orthogonalize (NS)",
    "AdamW part",
    "grad clipping",
    "other optimizer",
    "rest of step",
)


def breakdown_figure(rows: list[dict[str, Any]], label: Callable[[dict[str, Any]], str]) -> Any:
    """Stacked medians of the step's parts (ms) per run: each measured part as measured, the optimizer's and the
    step's remainders as the median of each step's own (`bench.results.report.add_remainders`), none scaled to
    fit (a negative remainder, parts timed to overlap their whole, is drawn as 0); the legend sits right of the
    axes, clear of the bars."""
    keys = ("fwd_bwd_s_median", "comm_s_median", "ns_s_median", "adamw_s_median", "clip_s_median",
            "other_optim_s_median", "rest_s_median")  # fmt: skip
    parts = {k: [max(_num(r.get(key)) or 0.0, 0.0) * 1e3 for r in rows] for k, key in zip(BREAKDOWN_PARTS, keys)}
    fig, ax = _figure()
    bottom = [0.0] * len(rows)
    names = [label(r) for r in rows]
    for k, vals in parts.items():
        ax.bar(names, vals, bottom=bottom, label=k)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("ms per step (medians)")
    ax.set_title("Step time breakdown")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


def curves_figure(
    steps: Any,
    rows: list[dict[str, Any]],
    key: str,
    ylabel: str,
    label: Callable[[dict[str, Any]], str],
    *,
    scale: float = 1.0,
) -> Any:
    """One curve per run (its own line style and marker); non-finite values are not drawn, and a run that
    diverged gets an `x` and a dotted vertical line at its first non-finite step."""
    fig, ax = _figure()
    for i, r in enumerate(rows):
        s = steps[steps["run_id"] == r["run_id"]]
        if not len(s):
            continue
        ls, marker = STYLES[i % len(STYLES)]
        name = label(r) if r.get("status") == "ok" else f"{label(r)} [{r.get('status')}]"
        y = s[key].astype(float) * scale
        finite = y.map(math.isfinite)
        (line,) = ax.plot(s["step"][finite], y[finite], linestyle=ls, marker=marker, markersize=4, label=name)
        at = _num(r.get("diverged_at_step"))
        if at is not None:
            last = y[finite].iloc[-1] if finite.any() else 0.0
            ax.axvline(at, color=line.get_color(), linestyle=":", linewidth=1)
            ax.plot(
                [at],
                [last],
                marker="x",
                markersize=10,
                color=line.get_color(),
                linestyle="none",
                label=f"{label(r)} diverged at step {int(at)}",
            )
    warm = [int(w) for w in (_num(r.get("warmup_steps")) for r in rows) if w is not None]
    if warm and max(warm) > 0:
        ax.axvspan(-0.5, max(warm) - 0.5, color="0.9", label="warm-up (excluded)")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


def step_times_figure(results: list[dict[str, Any]], *, target_ms: float | None = None) -> Any:
    """Grouped horizontal bars of `bench.tools.optim_step` results: one group per implementation, one bar per result
    (its layout and warm-up steps), the median with its IQR as an error bar; `target_ms` as a dashed line."""
    impls: list[str] = []
    for res in results:
        impls += [r["impl"] for r in res["rows"] if r["impl"] not in impls]
    fig, ax = _figure(width=8.0)
    fig.set_figheight(max(3.0, 0.45 * len(impls) * max(1, len(results)) ** 0.5 + 1.0))
    height = 0.8 / max(1, len(results))
    for i, res in enumerate(results):
        rows = {r["impl"]: r for r in res["rows"]}
        ys = [k + (i - (len(results) - 1) / 2) * height for k, name in enumerate(impls) if name in rows]
        med = [rows[name]["median_ms"] for name in impls if name in rows]
        iqr = [rows[name]["iqr_ms"] / 2 for name in impls if name in rows]
        label = f"{res.get('layout', 'separate')}, {res.get('warmup', 1)} warm-up steps"
        bars = ax.barh(ys, med, height, xerr=iqr, label=label, capsize=2)
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=3)
    if target_ms is not None:
        ax.axvline(target_ms, color="black", linestyle="--", linewidth=1, label=f"{target_ms:g} ms")
    ax.set_yticks(range(len(impls)), impls)
    ax.invert_yaxis()
    ax.set_xlabel("ms per optimizer step (median, IQR bar)")
    ax.set_xscale("log")
    dev = results[0].get("device_name", "") if results else ""
    ax.set_title(f"One Qwen3-30B-A3B layer's optimizer step, {dev}")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig
