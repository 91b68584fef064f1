"""The comparison of two arms of runs: the model-only ratio with its 95% interval, the warm-up each run needs, and
the verdict the interval supports (docs/compare.md).

The model, for step s of run r in arm a (baseline 0, variant 1)::

    log t[r, s] = mu + delta * a + u[r] + e[r, s]

`u[r]` is the run's own offset (between processes: kernel algorithm choice, memory layout, a host that drifts) and
`e[r, s]` the step noise inside a run. The run-level statistic (the median of a run's steady log step times) carries
both; for runs of one arm they are independent and identically spread, so the interval of `delta` is Student's t on
the run statistics with a pooled variance and `n_A + n_B - 2` degrees of freedom (the REML interval of the nested
model for balanced runs). Steps within a run are never treated as independent of each other: with few runs the
interval is as wide as the spread between runs says, however many steps each run has. Runs alternate in crossover
order (A B B A ...), so a linear drift of the host falls on both arms equally.

Everything takes plain sequences and returns floats: no torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95

THROTTLE_BITS = {
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
"""NVML clock-event reasons (nvml.h `nvmlClocksEventReason*`) that flag a step `throttled`: thermal and hardware
slowdowns. The software power cap (0x4) is left out: a Hopper GPU at full load sits at its power cap nearly all the
time, and what it costs shows in the SM clock each step records (docs/compare.md#telemetry)."""


def throttled(reasons: float | None) -> bool:
    """Whether a step's clock-event reason bits hold a thermal or hardware slowdown (`THROTTLE_BITS`)."""
    return bool(int(reasons or 0) & sum(THROTTLE_BITS))


def crossover_arm(index: int) -> str:
    """Arm of the run at 0-based position `index` in the order A B B A A B B A ...: every block of four balances a
    linear drift, and every adjacent pair holds one run of each arm."""
    return "A" if index % 4 in (0, 3) else "B"


def warmup_from_data(times: Sequence[float], *, floor: int = 1, rel_tol: float = 0.02, k_mad: float = 5.0) -> int:
    """How many leading steps of one run to drop, decided from its step times.

    The steady band is the median of the run's second half +- max(`k_mad` robust SDs, `rel_tol` x median); the
    warm-up ends after the last step of the first half that lies outside it (CUDA-graph capture, the first
    iterations of a framework, a cold kernel plan are all early and slow). A late outlier (a collection pause) does
    not extend it. Never less than `floor` (the run's configured warm-up)."""
    t = np.asarray(times, dtype=float)
    if t.size < 4:
        return min(max(floor, 0), int(t.size))
    tail = t[t.size // 2 :]
    med = float(np.median(tail))
    mad = float(np.median(np.abs(tail - med))) * 1.4826
    band = max(k_mad * mad, rel_tol * med)
    outside = [i for i in range(t.size // 2) if abs(t[i] - med) > band]
    return max(floor, outside[-1] + 1 if outside else 0)


def run_statistic(times: Sequence[float]) -> float:
    """One run's statistic: the median of its steady steps' log times (robust to a lone slow step)."""
    if len(times) == 0:
        raise ValueError("a run without steady steps has no statistic")
    return float(np.median(np.log(np.asarray(times, dtype=float))))


@dataclass(frozen=True)
class Comparison:
    """The variant against the baseline, from the run statistics of each arm.

    `ratio` is the baseline's time over the variant's: the variant's model TF/s over the baseline's (both do the
    same model FLOPs), so a variant that costs 2% has ratio 0.98. `cost = 1 - ratio`. Intervals are 95%;
    `half_width` is half the ratio interval's width. `sd_between` is the pooled SD of the run statistics (log
    scale: 0.01 = 1% from run to run); `df` its degrees of freedom (0: no interval)."""

    ratio: float
    ci95: tuple[float, float]
    cost: float
    cost_ci95: tuple[float, float]
    half_width: float
    runs: tuple[int, int]
    sd_between: float
    df: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def compare(baseline: Sequence[float], variant: Sequence[float]) -> Comparison:
    """The comparison of two arms from their run statistics (`run_statistic` of each run). With fewer than two runs
    in either arm there is no spread to estimate: the interval is (nan, nan) and `df` is 0."""
    a = np.asarray(baseline, dtype=float)
    b = np.asarray(variant, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError(f"need at least one run per arm; got {a.size} baseline and {b.size} variant runs")
    delta = float(b.mean() - a.mean())
    df = int(a.size + b.size - 2)
    if a.size < 2 or b.size < 2:
        sd, lo_d, hi_d = math.nan, math.nan, math.nan
    else:
        ss = float(((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum())
        sd = math.sqrt(ss / df)
        se = sd * math.sqrt(1 / a.size + 1 / b.size)
        t = float(stats.t.ppf(0.5 + CONFIDENCE / 2, df))
        lo_d, hi_d = delta - t * se, delta + t * se
    ratio = math.exp(-delta)
    lo, hi = math.exp(-hi_d), math.exp(-lo_d)
    return Comparison(
        ratio=ratio,
        ci95=(lo, hi),
        cost=1 - ratio,
        cost_ci95=(1 - hi, 1 - lo),
        half_width=(hi - lo) / 2,
        runs=(int(a.size), int(b.size)),
        sd_between=sd,
        df=df if a.size >= 2 and b.size >= 2 else 0,
    )


def runs_per_arm_needed(sd_between: float, precision: float, *, cap: int = 1000) -> int | None:
    """Runs per arm at which the ratio interval's half-width falls to `precision`, at this spread between runs
    (balanced arms: t(2n-2) x sd x sqrt(2/n) <= precision, on the log scale, which equals the ratio's near 1).
    None when not even `cap` runs would do, or the spread is unknown."""
    if not math.isfinite(sd_between) or precision <= 0:
        return None
    if sd_between == 0:
        return 2
    for n in range(2, cap + 1):
        if stats.t.ppf(0.5 + CONFIDENCE / 2, 2 * n - 2) * sd_between * math.sqrt(2 / n) <= precision:
            return n
    return None


def _pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def verdict(
    c: Comparison,
    *,
    precision: float,
    variant: str,
    baseline: str,
    fwd_bwd: Comparison | None = None,
    optim_cost: float | None = None,
) -> str:
    """What the interval supports, in one or two sentences.

    - half-width above `precision`: no verdict; how wide, and how many runs per arm would narrow it at this spread;
    - the cost interval holds 0: "no measurable cost" at that width;
    - else "costs X%" or "is X% faster"; and "costs its optimizer step" only where the forward-backward interval is
      itself within `precision` and holds 0, and the optimizer step's own share (`optim_cost`, the step-time
      difference of the optimizer phase over the variant's step) lies inside the cost interval."""
    lo, hi = c.cost_ci95
    head = f"{variant} costs {_pct(c.cost)} of {baseline}'s model TF/s (95% interval {_pct(lo)} to {_pct(hi)})"
    if c.df == 0 or not math.isfinite(c.half_width):
        return f"{head}: no interval yet (at least two runs of each arm are needed)."
    if c.half_width > precision:
        need = runs_per_arm_needed(c.sd_between, precision)
        more = (
            f"about {need} runs per arm at this run-to-run spread ({100 * c.sd_between:.2f}%) would narrow it"
            if need is not None
            else f"the run-to-run spread ({100 * c.sd_between:.2f}%) is too large for any practical number of runs"
        )
        return (
            f"{head}: the interval is +-{100 * c.half_width:.2f}%, wider than the +-{100 * precision:.2f}% asked "
            f"for, so no verdict; {more} (it has {c.runs[0]} and {c.runs[1]})."
        )
    if lo <= 0 <= hi:
        return f"{head}: no measurable cost at +-{100 * c.half_width:.2f}%."
    what = f"{head}: a cost" if lo > 0 else f"{head}: {variant} is faster"
    if (
        lo > 0
        and fwd_bwd is not None
        and optim_cost is not None
        and fwd_bwd.df > 0
        and fwd_bwd.half_width <= precision
        and fwd_bwd.cost_ci95[0] <= 0 <= fwd_bwd.cost_ci95[1]
        and lo <= optim_cost <= hi
    ):
        return f"{what}; forward-backward is equal within +-{100 * fwd_bwd.half_width:.2f}%: it costs its optimizer step."
    return f"{what}."
