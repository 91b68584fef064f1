"""Fit of the predicted peak memory (`bench.memory.predict`) on the committed GPU runs' measured peaks.

    python -m bench.tools.perfmodel.memfit            # writes bench/tools/perfmodel/data/memory_fit.json

Per engine, least squares of (measured peak - the exact parts) on the fitted terms' features (`bench.memory.TERMS`),
over the successful runs of `calibration.GPU_RUNS`; each coefficient is one number per engine. The file keeps the
coefficients, the runs, the in-sample relative errors and the leave-one-out ones (each run predicted by the fit on
the others).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench import memory
from bench.tools.perfmodel.calibration import GPU_RUNS, derived_provenance, load_runs

COMMAND = "python -m bench.tools.perfmodel.memfit"


def samples(path: Path = GPU_RUNS) -> dict[str, list[dict[str, Any]]]:
    """Per engine: {run, exact (bytes), features (TERMS), measured (bytes)} of each run with a measured peak."""
    from bench.tools.perfmodel.h200 import _typed

    out: dict[str, list[dict[str, Any]]] = {}
    for rec in load_runs(path):
        peak = (rec.get("summary") or {}).get("peak_mem_bytes")
        if not peak:
            continue
        cfg = _typed(rec["config"])
        exact, feats = memory.features(cfg)
        out.setdefault(cfg.engine.name, []).append(
            {"run": rec["run"], "exact": sum(exact.values()), "features": feats, "measured": float(peak)}
        )
    return out


def _solve(rows: list[dict[str, Any]]) -> np.ndarray:
    x = np.array([[r["features"][t] for t in memory.TERMS] for r in rows])
    y = np.array([r["measured"] - r["exact"] for r in rows])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return np.maximum(coef, 0.0)


def _errors(rows: list[dict[str, Any]], coef: np.ndarray) -> list[float]:
    return [
        (r["exact"] + float(np.dot([r["features"][t] for t in memory.TERMS], coef))) / r["measured"] - 1.0
        for r in rows
    ]


def fit(path: Path = GPU_RUNS) -> dict[str, Any]:
    """Per engine: coefficients, number of runs, in-sample and leave-one-out relative errors (range and per run)."""
    engines: dict[str, Any] = {}
    for engine, rows in sorted(samples(path).items()):
        coef = _solve(rows)
        loo = [_errors([r], _solve(rows[:i] + rows[i + 1 :]))[0] for i, r in enumerate(rows)]
        inside = _errors(rows, coef)
        engines[engine] = {
            "coefficients": dict(zip(memory.TERMS, (float(c) for c in coef), strict=True)),
            "num_runs": len(rows),
            "in_sample_rel_error": [min(inside), max(inside)],
            "loo_rel_error": [min(loo), max(loo)],
            "runs": {r["run"]: {"in_sample": e, "loo": e_loo} for r, e, e_loo in zip(rows, inside, loo, strict=True)},
        }
    return {
        "about": (
            "Coefficients of bench.memory.predict per engine (bytes per feature unit: activations per forward "
            "activation byte, logits per token and vocabulary entry, optimizer_transient per local expert parameter "
            "of a matrix optimizer), least squares on the measured peaks of the committed GPU runs"
        ),
        "provenance": derived_provenance(path, COMMAND),
        "engines": engines,
    }


def main(argv: list[str] | None = None) -> int:
    import json

    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else memory.FIT
    doc = fit()
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    for engine, e in doc["engines"].items():
        lo, hi = e["loo_rel_error"]
        print(f"{engine}: {e['num_runs']} runs, leave-one-out error {100 * lo:+.1f}% to {100 * hi:+.1f}%")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
