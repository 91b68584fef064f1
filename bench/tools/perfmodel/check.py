"""Do measured step times fall inside the intervals predicted for them? `python -m bench.tools.perfmodel.check DIR`

DIR holds one `muonbench compare` folder per case under `cases/` (each with its `summary.json`, which records every
arm's prediction beside its runs: `project.prediction_of`). For each case and arm: the median of its runs' median
steady steps against the predicted step's interval, how many single runs fall inside, the interval's half-width
(worst side, relative to the prediction) and the hardware profile the prediction rested on. A case passes when every
arm's median is inside, no interval is wider than `MAX_HALF_WIDTH`, and the prediction rests on a hardware profile
(not "not calibrated"). Writes DIR/summary.json; exit 0 when every case passes, 1 otherwise, 2 on bad input.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

MAX_HALF_WIDTH = 0.10
"""Widest interval a calibrated prediction may state (relative to the prediction, worse side)."""


def check_arm(predicted: dict[str, Any], runs: list[float]) -> dict[str, Any]:
    """One arm: its predicted step and interval against its runs' median steps."""
    lo, hi = predicted["step_time_s_interval"]
    pred, measured = predicted["step_time_s"], statistics.median(runs)
    half = max(hi / pred - 1.0, 1.0 - lo / pred)
    calibrated = not predicted["hardware_profile"].startswith("not calibrated")
    inside = lo <= measured <= hi
    return {
        "predicted_s": pred,
        "interval_s": [lo, hi],
        "measured_s": measured,
        "rel_error": pred / measured - 1.0,
        "inside": inside,
        "runs_inside": sum(1 for r in runs if lo <= r <= hi),
        "runs": len(runs),
        "half_width": half,
        "hardware_profile": predicted["hardware_profile"],
        "passed": inside and half <= MAX_HALF_WIDTH and calibrated,
    }


def check_case(summary: dict[str, Any]) -> dict[str, Any]:
    """Every arm of one compare summary."""
    arms = {}
    for arm, optimizer in (("A", summary["baseline"]), ("B", summary["variant"])):
        predicted = (summary.get("predicted") or {}).get(arm) or {}
        if "step_time_s" not in predicted:
            raise ValueError(f"arm {arm} ({optimizer}): no prediction recorded ({predicted.get('none', 'missing')})")
        runs = [r["step_s_median"] for r in summary["per_run"] if r["arm"] == arm]
        arms[optimizer] = check_arm(predicted, runs)
    return {"model": summary["model"], "engine": summary["engine"], "gpu": summary["gpu"], "arms": arms,
            "passed": all(a["passed"] for a in arms.values())}  # fmt: skip


def check(folder: Path) -> dict[str, Any]:
    """Every case under `folder`/cases; ValueError naming the folder when there is none or one lacks a summary."""
    cases = sorted(p for p in (folder / "cases").glob("*") if p.is_dir())
    if not cases:
        raise ValueError(f"{folder}/cases: no compare folder (run the report's reproduce.sh first)")
    out = {}
    for case in cases:
        path = case / "summary.json"
        if not path.is_file():
            raise ValueError(f"{path}: missing (the compare of case {case.name} did not finish)")
        try:
            out[case.name] = check_case(json.loads(path.read_text()))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from None
    return {"max_half_width": MAX_HALF_WIDTH, "cases": out, "passed": all(c["passed"] for c in out.values())}


def provenance(folder: Path) -> dict[str, Any]:
    """run.json of the check: our commit, the date, the command, and the GPU, driver and versions of the profile
    the predictions rested on (`folder`/profile.json, written by the report's reproduce.sh)."""
    from bench.results import record

    path = folder / "profile.json"
    profile = json.loads(path.read_text()) if path.is_file() else {}
    return {"git": record.git_info(), "date": record.now_iso(), "command": " ".join(["python -m bench.tools.perfmodel.check", str(folder)]),
            "gpu": profile.get("gpu"), "hardware_profile": profile.get("command"), "host": record.hardware_info()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[0], file=sys.stderr)
        return 0 if args and args[0] in ("-h", "--help") else 2
    try:
        result = check(Path(args[0]))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    folder = Path(args[0])
    (folder / "summary.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    (folder / "run.json").write_text(json.dumps(provenance(folder), indent=1, sort_keys=True) + "\n")
    for name, case in result["cases"].items():
        for opt, a in case["arms"].items():
            print(f"{name} {opt}: measured {a['measured_s']:.3f} s, predicted {a['predicted_s']:.3f} s "
                  f"({a['interval_s'][0]:.3f} - {a['interval_s'][1]:.3f}, +-{a['half_width']:.1%}): "
                  f"{'inside' if a['inside'] else 'OUTSIDE'}, {a['runs_inside']}/{a['runs']} runs inside; "
                  f"{a['hardware_profile']}")  # fmt: skip
    print(f"{'passed' if result['passed'] else 'FAILED'}: {Path(args[0]) / 'summary.json'}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
