"""Per-optimizer summary of a quality sweep's trials (no torch: runs where the report is written).

- Best setting: the end of the optimizer's tuning (`bench.tools.quality.tuning.walk`); for a sweep still running,
  the lowest finite final validation loss among its grid-seed trials so far. Each tuned dimension's grid, best
  value and edge flag are kept (`grids`).
- Target: the mean final validation loss of AdamW's runs at its best setting (all its seeds).
- Per run at an optimizer's best setting: steps, tokens and wall seconds to the target (first crossing,
  interpolated between evaluations); per optimizer their mean and range over seeds, `reached` = runs that cross.
- AdamW's reference: its full run (the tokens of a trial; the mean wall seconds of its best-setting runs). Ratio =
  an optimizer's mean to the target / AdamW's reference, for tokens and for wall-clock, with a 95% percentile
  bootstrap interval (`BOOTSTRAP` replicates): the optimizer's seeds and AdamW's seeds are resampled with
  replacement and the target is recomputed from each AdamW resample. A replicate in which a resampled seed never
  reaches the target has an infinite ratio, so an interval whose upper end is infinite says the target is not
  reached reliably.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from bench.tools.quality import tuning
from bench.tools.quality.config import QualityConfig

INF = float("inf")
BOOTSTRAP = 10_000
"""Bootstrap replicates of every ratio's interval (numpy's default generator, seed 0: a report is reproducible)."""


def crossings(curve: list[dict[str, float]], targets: np.ndarray, key: str) -> np.ndarray:
    """For each target, the first point (interpolated) where val_loss <= target, in units of `key` (step, tokens or
    wall_s); inf where the curve never reaches it."""
    targets = np.asarray(targets, dtype=float)
    if not curve:
        return np.full(targets.shape, INF)
    vals = np.array([p["val_loss"] for p in curve], dtype=float)
    xs = np.array([float(p[key]) for p in curve])
    below = vals[None, :] <= targets.reshape(-1, 1)
    first = below.argmax(axis=1)
    hit = below.any(axis=1)
    prev = np.maximum(first - 1, 0)
    dv = vals[prev] - vals[first]
    frac = np.divide(vals[prev] - targets.reshape(-1), dv, out=np.zeros_like(dv), where=dv != 0)
    out = np.where(first == 0, xs[first], xs[prev] + frac * (xs[first] - xs[prev]))
    return np.where(hit, out, INF).reshape(targets.shape)


def crossing(curve: list[dict[str, float]], target: float, key: str) -> float | None:
    """`crossings` of one target; None where it is never reached."""
    x = float(crossings(curve, np.array([target]), key)[0])
    return None if x == INF else x


def _stats(xs: list[float | None]) -> dict[str, float | None]:
    got = [x for x in xs if x is not None]
    if not got or len(got) < len(xs):  # a seed that never reaches the target: no mean time
        return {"mean": None, "min": min(got) if got else None, "max": max(got) if got else None}
    return {"mean": statistics.fmean(got), "min": min(got), "max": max(got)}


def config_of(cfg: dict[str, Any]) -> QualityConfig:
    """The QualityConfig of a sweep's stored `config` (keys this version does not know are dropped; ones an
    older sweep did not store take their defaults)."""
    fields = QualityConfig.__dataclass_fields__
    kw: dict[str, Any] = {}
    for k, v in cfg.items():
        if k not in fields:
            continue
        if k in ("lr_grids", "grids"):
            v = {d: tuple(g) for d, g in v.items()}
        kw[k] = tuple(v) if isinstance(v, list) else v
    return QualityConfig(**kw)


def best_runs(
    trials: list[dict[str, Any]], name: str, cfg: QualityConfig
) -> tuple[tuning.Hparams | None, list[dict[str, Any]], tuning.Walk]:
    """(best setting, its finished runs over seeds, the tuning walk) of `name`."""
    done = {tuning.trial_id(t["optimizer"], tuning.hparams_of(t, cfg), cfg): t for t in trials}
    walk = tuning.walk(name, cfg, done)
    best = walk.best
    if best is None:  # tuning still running: the best grid-seed trial so far
        mine = [
            t
            for t in trials
            if t["optimizer"] == name and t["seed"] == cfg.seed and t["final_val_loss"] < INF
        ]
        if not mine:
            return None, [], walk
        best = tuning.hparams_of(min(mine, key=lambda t: t["final_val_loss"]), cfg)
    runs = [
        t
        for t in trials
        if t["optimizer"] == name
        and t["final_val_loss"] < INF
        and replace(tuning.hparams_of(t, cfg), seed=best.seed) == best
    ]
    return best, sorted(runs, key=lambda t: t["seed"]), walk


def ratio_interval(
    runs: list[dict[str, Any]], adam_runs: list[dict[str, Any]], key: str, *, rng: np.random.Generator
) -> tuple[float, float]:
    """95% percentile-bootstrap interval of mean(`key` to AdamW's target over `runs`) / AdamW's reference."""
    adam_final = np.array([t["final_val_loss"] for t in adam_runs])
    ref = np.array([t["wall_s"] if key == "wall_s" else t["steps"] * t["tokens_per_step"] for t in adam_runs])
    ia = rng.integers(0, len(adam_runs), size=(BOOTSTRAP, len(adam_runs)))
    io = rng.integers(0, len(runs), size=(BOOTSTRAP, len(runs)))
    targets = adam_final[ia].mean(axis=1)
    to = np.stack([crossings(t["curve"], targets, key) for t in runs], axis=1)  # (replicate, run)
    ratio = np.take_along_axis(to, io, axis=1).mean(axis=1) / ref[ia].mean(axis=1)
    lo, hi = np.quantile(ratio, [0.025, 0.975], method="inverted_cdf")
    return float(lo), float(hi)


def _finite(x: float | None) -> float | None:
    return None if x is None or x == INF else x


def summarize(trials: list[dict[str, Any]], cfg: QualityConfig) -> dict[str, Any]:
    """Target, AdamW reference, one row per optimizer (in `cfg.optimizers` order, then any others) and its
    tuning record."""
    names = list(dict.fromkeys([*cfg.optimizers, *(t["optimizer"] for t in trials)]))
    names = [n for n in names if any(t["optimizer"] == n for t in trials)]
    _, adam_runs, _ = best_runs(trials, "adamw", cfg)
    if not adam_runs:
        raise ValueError("the quality summary needs a finished AdamW trial (the target is its final loss)")
    target = statistics.fmean(t["final_val_loss"] for t in adam_runs)
    adam_wall = statistics.fmean(t["wall_s"] for t in adam_runs)
    adam_step_s = adam_wall / adam_runs[0]["steps"]
    adam_tokens = adam_runs[0]["steps"] * adam_runs[0]["tokens_per_step"]
    rng = np.random.default_rng(0)
    rows, arms = [], {}
    for name in names:
        best, runs, walk = best_runs(trials, name, cfg)
        if best is None:
            continue
        lr_stage = next((s for s in walk.stages if s.dim == "lr"), None)
        grid_lrs = (
            lr_stage.values
            if lr_stage
            else sorted({t["lr"] for t in trials if t["optimizer"] == name and t["seed"] == cfg.seed})
        )
        finals = [t["final_val_loss"] for t in runs]
        to = {
            k: _stats([crossing(t["curve"], target, k) for t in runs]) for k in ("step", "tokens", "wall_s")
        }
        wall = to["wall_s"]["mean"]
        step_s = statistics.fmean(t["wall_s"] / t["steps"] for t in runs)
        edges = [s.dim for s in walk.stages if s.at_edge]
        row = {
            "optimizer": name,
            "best_lr": best.lr,
            "best_adamw_lr": best.adamw_lr,
            "grid": " ".join(f"{x:g}" for x in grid_lrs),
            "best_at_grid_edge": "lr" in edges
            or (not walk.stages and best.lr in (grid_lrs[0], grid_lrs[-1])),
            "edges": " ".join(edges),
            "tuning_runs": walk.num_tuning_runs,
            "runs": walk.num_runs,
            "seeds": len(runs),
            "final_val_loss": statistics.fmean(finals),
            "final_val_loss_std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
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
            "cost_to_target": None if wall is None else wall / 3600 * cfg.price_per_hour,
            "step_ms": 1e3 * step_s,
            "opt_step_ms": 1e3 * statistics.fmean(t["opt_step_s"] / t["steps"] for t in runs),
            "step_time_vs_adamw": step_s / adam_step_s,
            "tokens_per_s": statistics.fmean(t["steps"] * t["tokens_per_step"] / t["wall_s"] for t in runs),
        }
        other = name != "adamw"
        row["tokens_ratio_ci95"] = ratio_interval(runs, adam_runs, "tokens", rng=rng) if other else None
        row["wall_ratio_ci95"] = ratio_interval(runs, adam_runs, "wall_s", rng=rng) if other else None
        rows.append(row)
        arms[name] = _arm(name, best, runs, walk, cfg, complete=walk.best is not None and not walk.todo)
    return {
        "target": target,
        "adamw_wall_s": adam_wall,
        "adamw_tokens": adam_tokens,
        "rows": rows,
        "arms": arms,
    }


def _arm(
    name: str,
    best: tuning.Hparams,
    runs: list[dict[str, Any]],
    walk: tuning.Walk,
    cfg: QualityConfig,
    *,
    complete: bool,
) -> dict[str, Any]:
    """`summary.json`'s record of one optimizer: its grids, best setting, seeds and what its tuning cost."""
    dims = tuning.tuned_dims(name, cfg)
    used = tuning.ADAMW_DIMS if tuning.is_adamw(name) else tuning.MATRIX_DIMS
    best_d = {k: v for k, v in asdict(best).items() if k in used}
    if tuning.tied_adamw_lr(name, cfg):
        best_d["adamw_lr"] = "tied to lr"
    finals = [t["final_val_loss"] for t in runs]
    lr_stage = next((s for s in walk.stages if s.dim == "lr"), None)
    return {
        "lr_grid": lr_stage.values if lr_stage else list(tuning.grid(name, "lr", cfg)),
        "best": best_d,
        "seeds": [t["seed"] for t in runs],
        "final_val_loss": {
            "mean": statistics.fmean(finals),
            "std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
            "per_seed": finals,
        },
        "tuned": list(dims),
        "grids": {
            s.dim: {
                "values": s.values,
                "final_val_loss": [_finite(s.losses.get(v)) for v in s.values],
                "best": s.best,
                "at_edge": s.at_edge,
                "extensions": s.extensions,
            }
            for s in walk.stages
        },
        "best_at_grid_edge": [s.dim for s in walk.stages if s.at_edge],
        "runs": {
            "tuning": walk.num_tuning_runs,
            "seeds": walk.num_runs - walk.num_tuning_runs,
            "total": walk.num_runs,
        },
        "complete": complete,
        "failed_stage": walk.failed_stage,
    }
