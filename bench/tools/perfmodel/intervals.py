"""Prediction intervals of the step time: out-of-sample errors on the committed GPU runs, and the spread over the
assumed constants of hardware rows without runs.

    python -m bench.tools.perfmodel.intervals     # writes bench/tools/perfmodel/data/prediction_errors.json

Out of sample: every successful run of `calibration.GPU_RUNS` (the committed GPU runs) is predicted by a model whose
fitted values did not see it: runs outside a fit are predicted as they are; a run of the Bridge fit is predicted with
the H200 Bridge fraction refitted without it (leave-one-out); the one run the H200 Megatron fraction is fitted on
cannot be left out of its own fit and counts in-sample only. Relative errors e = predicted / measured - 1 per engine
and hardware; an interval for a new prediction p is [p / (1 + max e), p / (1 + min e)], which covers a new run's
error with probability (n - 1) / (n + 1) if errors are exchangeable (n runs).

Hardware without runs: the prediction evaluated under each assumption set of the row (`ASSUMED`): GEMM fraction,
memory-bound fraction and host cost per NS call at the ends of their plausible ranges; for GB300 each set's
memory-bound fraction is refitted on NVIDIA's Table 1 (so its spread is the sensitivity of the assumptions the fit
cannot tell apart, not the fit's in-sample error). Where the row is not calibrated for the engine, the engine's
out-of-sample errors on other hardware widen that spread.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

from bench.tools.perfmodel import constants as C
from bench.tools.perfmodel.calibration import BRIDGE_RUNS, DATA, GPU_RUNS, derived_provenance, load_runs

ERRORS = DATA / "prediction_errors.json"
COMMAND = "python -m bench.tools.perfmodel.intervals"
GEMM_RANGE = (0.65, 0.80)
"""bf16 GEMM fraction of the datasheet peak where the row has no measurement (ours: 701 / 989 = 0.709 on H200)."""
HBM_RANGE = (C.H200_HBM_FIT, C.GB300_HBM_FIT)
"""Memory-bound fraction where the row has no fit: the lowest and highest fitted on any row."""
X86_HOST_RANGE = (0.486, 0.785)
"""Host ms per matrix of the published NS loop measured on our x86 H200 hosts (constants._X86_HOST)."""
GRACE_HOST_RANGE = (0.21, 0.755)
"""GB300 (Grace) host: what Table 1's Qwen3 Muon row allows at most, and our x86 host's in-situ measurement."""


def _assumption_grid(hardware: str) -> list[dict[str, float]]:
    """The assumption sets of a row without runs (before any refit)."""
    if hardware == "gb300":
        return [{"gemm": g, "eo_loop_ms": h} for g, h in itertools.product(GEMM_RANGE, GRACE_HOST_RANGE)]
    return [
        {"gemm": g, "hbm": m, "eo_loop_ms": h}
        for g, m, h in itertools.product(GEMM_RANGE, HBM_RANGE, X86_HOST_RANGE)
    ]


@contextmanager
def assumed(hardware: str, values: dict[str, float]) -> Iterator[None]:
    """Temporarily replace a row's GEMM fractions (`gemm`), memory-bound fractions (`hbm`, for both engines) and
    published NS host cost (`eo_loop_ms`)."""
    old = C.FITTED[hardware]
    new = old
    if "gemm" in values:
        g = C.Sourced(value=values["gemm"], source="assumption set")
        new = replace(new, gemm_bf16=g, gemm_fp8=g)
    if "hbm" in values:
        m = C.Sourced(value=values["hbm"], source="assumption set")
        new = replace(new, hbm=m, hbm_bridge=m if old.hbm_bridge is not None else None)
    if "eo_loop_ms" in values:
        new = replace(new, eo_loop_ms=C.Sourced(value=values["eo_loop_ms"], source="assumption set"))
    C.FITTED[hardware] = new
    try:
        yield
    finally:
        C.FITTED[hardware] = old


def assumption_sets(hardware: str) -> list[dict[str, float]]:
    """A row's assumption sets; GB300's with the memory-bound fraction refitted on Table 1 for each (and the worst
    Table 1 error of that refit)."""
    from bench.tools.perfmodel import calibrate

    sets = _assumption_grid(hardware)
    if hardware != "gb300":
        return sets
    out = []
    for values in sets:
        with assumed(hardware, values):
            hbm, worst = calibrate.fit_gb300_hbm(iters=25)
        out.append({**values, "hbm": hbm, "table1_worst_rel_error": worst})
    return out


def _profile(cfg: dict[str, Any]) -> str:
    return "ours" if cfg["optimizer"].get("implementation") == "ours" else "published"


def run_errors(path: Path = GPU_RUNS, *, optimizer_loo: bool = True) -> list[dict[str, Any]]:
    """One row per successful run in the model's scope: measured and predicted step and optimizer step, whether the
    run is in a fit, its in-sample error and its out-of-sample (leave-one-out) error (for the optimizer step of a
    run in the optimizer fraction's fit only with `optimizer_loo`: one refit per such run)."""
    from bench.tools.perfmodel import calibrate, h200
    from bench.tools.perfmodel.model import predict

    bridge_fit = {r["run"] for r in load_runs(BRIDGE_RUNS)}
    refit: dict[str, float] = {}
    rows = []
    for rec in load_runs(path):
        s, cfg = rec.get("summary") or {}, rec["config"]
        if not s.get("step_s_median") or rec["experts"] in h200.OUT_OF_SCOPE:
            continue
        typed = h200._typed(cfg)
        engine, hardware = cfg["engine"]["name"], cfg["hardware"]["name"]
        pred = predict(typed, _profile(cfg))
        measured = float(s["step_s_median"])
        err = pred.step_time_s / measured - 1.0
        in_fit = rec["run"] == h200.FIT_RUN or (engine == "bridge" and rec["run"] in bridge_fit)
        oos: float | None = None if in_fit else err
        if engine == "bridge" and rec["run"] in bridge_fit:
            if rec["run"] not in refit:
                refit[rec["run"]] = calibrate.fit_h200_bridge_hbm(exclude=frozenset({rec["run"]}))[0]
            with calibrate.hbm_fraction("h200", refit[rec["run"]], "hbm_bridge"):
                oos = predict(typed, _profile(cfg)).step_time_s / measured - 1.0
        optim = s.get("optim_s_median")
        overlap = bool(cfg["optimizer"].get("ns_overlap"))
        optim_fit = bool(rec.get("ns_plan_ms")) and bool(optim) and not overlap
        optim_oos = None
        if optim and not overlap:
            optim_oos = pred.breakdown["optimizer_step"] / optim - 1.0
        if optim_fit and optimizer_loo:  # in the optimizer fraction's fit: refit without it
            x = calibrate.fit_h200_optimizer_hbm(exclude=frozenset({rec["run"]}), iters=20)[0]
            with calibrate.hbm_fraction("h200", x, "optimizer_hbm"):
                optim_oos = predict(typed, _profile(cfg)).breakdown["optimizer_step"] / optim - 1.0
        rows.append(
            {
                "run": rec["run"],
                "engine": engine,
                "hardware": hardware,
                "model": cfg["model"]["name"],
                "optimizer": cfg["optimizer"]["name"],
                "measured_step_s": measured,
                "predicted_step_s": pred.step_time_s,
                "in_fit": in_fit,
                "in_sample_rel_error": err,
                "oos_rel_error": oos,
                "measured_optim_s": None if overlap else optim,
                "predicted_optim_s": pred.breakdown["optimizer_step"],
                "optim_rel_error": None if overlap or not optim else pred.breakdown["optimizer_step"] / optim - 1.0,
                "optim_in_fit": optim_fit,
                "optim_oos_rel_error": optim_oos,
            }
        )
    return rows


def groups(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per `engine/hardware`: run counts, the in-sample errors of the fitted runs and the out-of-sample errors."""
    out: dict[str, dict[str, Any]] = {}
    for key in sorted({f"{r['engine']}/{r['hardware']}" for r in rows}):
        sel = [r for r in rows if f"{r['engine']}/{r['hardware']}" == key]
        oos = [r["oos_rel_error"] for r in sel if r["oos_rel_error"] is not None]
        fit = [r["in_sample_rel_error"] for r in sel if r["in_fit"]]
        out[key] = {
            "num_runs": len(sel),
            "num_out_of_sample": len(oos),
            "num_models": len({r["model"] for r in sel}),
            "oos_rel_error": [min(oos), max(oos)] if oos else None,
            "fit_in_sample_rel_error": [min(fit), max(fit)] if fit else None,
        }
    return out


def build(path: Path = GPU_RUNS) -> dict[str, Any]:
    """The content of `ERRORS`."""
    rows = run_errors(path)
    return {
        "about": __doc__.split("\n\n")[0],
        "provenance": derived_provenance(path, COMMAND),
        "groups": groups(rows),
        "assumption_sets": {hw: assumption_sets(hw) for hw in sorted(C.FITTED) if hw != "h200"},
        "runs": rows,
    }


@cache
def shipped(path: Path = ERRORS) -> dict[str, Any]:
    return json.loads(path.read_text())


def _spread(cfg: Any, profile: str, sets: list[dict[str, float]], **kw: Any) -> tuple[float, float]:
    from bench.tools.perfmodel.model import predict

    steps = []
    for values in sets:
        with assumed(cfg.hardware.name, {k: values[k] for k in ("gemm", "hbm", "eo_loop_ms") if k in values}):
            steps.append(predict(cfg, profile, **kw).step_time_s)
    return min(steps), max(steps)


def interval(cfg: Any, profile: str, step_s: float, **kw: Any) -> dict[str, Any]:
    """`step_time_s_interval` [lo, hi] of a prediction `step_s` of `cfg` and `step_time_s_interval_basis` (what it
    is computed from, in a line); `kw` goes to `predict` (ns_as_configured)."""
    doc = shipped()
    engine, hardware = cfg.engine.name, cfg.hardware.name
    group = doc["groups"].get(f"{engine}/{hardware}")
    if group and group["oos_rel_error"]:
        lo_e, hi_e = group["oos_rel_error"]
        n = group["num_out_of_sample"]
        return {
            "step_time_s_interval": [step_s / (1 + hi_e), step_s / (1 + lo_e)],
            "step_time_s_interval_basis": (
                f"out-of-sample errors of {n} committed {engine}-engine runs on {hardware} "
                f"({group['num_models']} models), {100 * lo_e:+.1f}% to {100 * hi_e:+.1f}% "
                f"(nominal coverage {(n - 1) / (n + 1):.0%})"
            ),
        }
    sets = doc["assumption_sets"].get(hardware)
    lo, hi = _spread(cfg, profile, sets, **kw) if sets else (step_s, step_s)
    lo, hi = min(lo, step_s), max(hi, step_s)
    basis = f"spread over {len(sets or [])} assumption sets of the {hardware} row (GEMM, memory-bound fraction, host)"
    if C.CALIBRATED.get((hardware, engine)) is None:
        other = [g["oos_rel_error"] for k, g in doc["groups"].items() if k.startswith(f"{engine}/")]
        other = [e for e in other if e]
        if other:
            lo_e, hi_e = min(e[0] for e in other), max(e[1] for e in other)
            lo, hi = lo / (1 + hi_e), hi / (1 + lo_e)
            basis += (
                f", widened by the {engine} engine's out-of-sample errors on other hardware "
                f"({100 * lo_e:+.1f}% to {100 * hi_e:+.1f}%): not calibrated on {hardware}"
            )
        else:
            basis += f"; no committed {engine}-engine run anywhere: not calibrated"
    return {"step_time_s_interval": [lo, hi], "step_time_s_interval_basis": basis}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else ERRORS
    doc = build()
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    for key, g in doc["groups"].items():
        e = g["oos_rel_error"]
        span = f"{100 * e[0]:+.1f}% to {100 * e[1]:+.1f}%" if e else "none"
        print(f"{key}: {g['num_runs']} runs, out of sample {g['num_out_of_sample']}: {span}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
