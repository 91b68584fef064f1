"""Per-micro-batch forward+backward times of a megatron_bench log (`bench.microbatch_times=true`), as a plot.

    python reports/megatron_h200_flops_202611/profile/microbatch_plot.py \
        reports/megatron_h200_flops_202611/logs/callK_flops.log reports/megatron_h200_flops_202611/microbatch_callK.png

The engine prints `microbatch ms: ...` (one time per micro-batch, in issue order) just before each `[case] step k`
line; the warm-up step (k = 0) is left out. One panel: each case's steady steps concatenated, smoothed over 8
micro-batches, with each case's median as a dashed line.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path


def parse(log: str) -> dict[str, list[list[float]]]:
    """case -> one list of micro-batch times (ms) per steady step."""
    out: dict[str, list[list[float]]] = {}
    pending: list[float] | None = None
    for line in log.splitlines():
        if line.startswith("microbatch ms:"):
            pending = [float(v) for v in line.split(":", 1)[1].split()]
            continue
        m = re.match(r"\[(\S+)\] step (\d+) ", line)
        if m and pending is not None:
            if int(m.group(2)) > 0:
                out.setdefault(m.group(1), []).append(pending)
            pending = None
    return out


def main(argv: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    src, dst = Path(argv[0]), Path(argv[1])
    data = parse(src.read_text())
    if not data:
        raise SystemExit(f"{src}: no 'microbatch ms:' lines (run with bench.microbatch_times=true)")
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for case, steps in data.items():
        xs = [v for s in steps for v in s]
        k = 8
        smooth = [statistics.fmean(xs[max(0, i - k + 1) : i + 1]) for i in range(len(xs))]
        (line,) = ax.plot(smooth, lw=1.2, label=f"{case} (median {statistics.median(xs):.1f} ms)")
        ax.axhline(statistics.median(xs), color=line.get_color(), ls="--", lw=0.8)
    n = len(next(iter(data.values()))[0])
    for b in range(1, len(next(iter(data.values())))):
        ax.axvline(b * n, color="0.8", lw=0.8)
    ax.set_xlabel(f"micro-batch (steady steps back to back, {n} per step)")
    ax.set_ylabel("forward+backward per micro-batch, ms (8-point mean)")
    ax.set_title(f"{src.name}: per-micro-batch time by case")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    for case, steps in data.items():
        xs = [v for s in steps for v in s]
        print(
            f"{case}: {len(steps)} steps x {len(steps[0])} micro-batches, median {statistics.median(xs):.2f} ms"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
