"""Per-optimizer summary of a quality sweep's trials (pure Python: no torch, runs where the report is written).

- Best learning rate: lowest finite final validation loss among the grid trials at the grid seed; flagged when it is
  the smallest or largest grid point (the optimum may lie outside the grid).
- Target: the mean final validation loss of AdamW's runs at its best learning rate (all its seeds).
- Per run at an optimizer's best learning rate: steps, tokens and wall seconds to the target (first crossing,
  interpolated between evaluations); per optimizer their mean and range over seeds, `reached` = runs that cross.
- AdamW's reference time: the mean wall seconds of its best-LR runs (the time it needs to reach its own final
  loss). Wall ratio = seconds to target / that; device-hours and cost from the seconds and `price_per_hour`.
"""

from __future__ import annotations

import statistics
from typing import Any

INF = float("inf")


def crossing(curve: list[dict[str, float]], target: float, key: str) -> float | None:
    """First point (interpolated) where val_loss <= target, in units of `key` (step, tokens or wall_s)."""
    prev = None
    for pt in curve:
        if pt["val_loss"] <= target:
            if prev is None:
                return pt[key]
            f = (prev["val_loss"] - target) / (prev["val_loss"] - pt["val_loss"])
            return prev[key] + f * (pt[key] - prev[key])
        prev = pt
    return None


def _stats(xs: list[float | None]) -> dict[str, float | None]:
    got = [x for x in xs if x is not None]
    if not got or len(got) < len(xs):  # a seed that never reaches the target: no mean time
        return {"mean": None, "min": min(got) if got else None, "max": max(got) if got else None}
    return {"mean": statistics.fmean(got), "min": min(got), "max": max(got)}


def best_runs(
    trials: list[dict[str, Any]], name: str, seed: int
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    grid = [t for t in trials if t["optimizer"] == name and t["seed"] == seed]
    ok = [t for t in grid if t["final_val_loss"] < INF]
    if not ok:
        return None, []
    best = min(ok, key=lambda t: t["final_val_loss"])
    runs = [
        t for t in trials if t["optimizer"] == name and t["lr"] == best["lr"] and t["final_val_loss"] < INF
    ]
    return best, sorted(runs, key=lambda t: t["seed"])


def summarize(trials: list[dict[str, Any]], cfg: dict[str, Any]) -> dict[str, Any]:
    """Target, AdamW reference and one row per optimizer (in `cfg["optimizers"]` order, then any others)."""
    names = list(dict.fromkeys([*cfg["optimizers"], *(t["optimizer"] for t in trials)]))
    names = [n for n in names if any(t["optimizer"] == n for t in trials)]
    seed = cfg["seed"]
    _, adam_runs = best_runs(trials, "adamw", seed)
    if not adam_runs:
        raise ValueError("the quality summary needs a finished AdamW trial (the target is its final loss)")
    target = statistics.fmean(t["final_val_loss"] for t in adam_runs)
    adam_wall = statistics.fmean(t["wall_s"] for t in adam_runs)
    adam_step_s = adam_wall / adam_runs[0]["steps"]
    adam_tokens = adam_runs[0]["steps"] * adam_runs[0]["tokens_per_step"]
    price = cfg["price_per_hour"]
    rows = []
    for name in names:
        best, runs = best_runs(trials, name, seed)
        if best is None:
            continue
        grid_lrs = sorted({t["lr"] for t in trials if t["optimizer"] == name and t["seed"] == seed})
        finals = [t["final_val_loss"] for t in runs]
        to = {
            k: _stats([crossing(t["curve"], target, k) for t in runs]) for k in ("step", "tokens", "wall_s")
        }
        wall = to["wall_s"]["mean"]
        step_s = statistics.fmean(t["wall_s"] / t["steps"] for t in runs)
        rows.append(
            {
                "optimizer": name,
                "best_lr": best["lr"],
                "grid": " ".join(f"{x:g}" for x in grid_lrs),
                "best_at_grid_edge": len(grid_lrs) > 1 and best["lr"] in (grid_lrs[0], grid_lrs[-1]),
                "seeds": len(runs),
                "final_val_loss": statistics.fmean(finals),
                "final_val_loss_min": min(finals),
                "final_val_loss_max": max(finals),
                "target": target,
                "reached": sum(crossing(t["curve"], target, "step") is not None for t in runs),
                "steps_to_target": to["step"]["mean"],
                "tokens_to_target": to["tokens"]["mean"],
                "tokens_ratio_vs_adamw": None
                if to["tokens"]["mean"] is None
                else to["tokens"]["mean"] / adam_tokens,
                "wall_s_to_target": wall,
                "wall_s_to_target_min": to["wall_s"]["min"],
                "wall_s_to_target_max": to["wall_s"]["max"],
                "wall_ratio_vs_adamw": None if wall is None else wall / adam_wall,
                "device_hours_to_target": None if wall is None else wall / 3600,
                "cost_to_target": None if wall is None else wall / 3600 * price,
                "step_ms": 1e3 * step_s,
                "opt_step_ms": 1e3 * statistics.fmean(t["opt_step_s"] / t["steps"] for t in runs),
                "step_time_vs_adamw": step_s / adam_step_s,
                "tokens_per_s": statistics.fmean(
                    t["steps"] * t["tokens_per_step"] / t["wall_s"] for t in runs
                ),
            }
        )
    return {"target": target, "adamw_wall_s": adam_wall, "adamw_tokens": adam_tokens, "rows": rows}
