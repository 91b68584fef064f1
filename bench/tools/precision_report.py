"""A precision report from the `muonbench compare` folders it holds: each case re-analysed from its runs, then one
`summary.json` (`cases`), `results.csv` and the README's results block, all generated.

    python -m bench.tools.precision_report reports/precision_<gpu>_<yyyymm>

The report folder holds `cases/<case>/` (a compare folder: compare.json + runs/). The README's text between
`<!-- cases:begin -->` and `<!-- cases:end -->` is replaced by the table of cases; the rest is the protocol, by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bench.entry import ArgParser
from bench.results.record import read_json, write_json_atomic
from bench.tools import compare

CASE_KEYS = ("model", "moe", "engine", "baseline", "variant", "ratio", "ci95", "runs", "steady_steps_per_run", "gpu",
             "gpu_minutes")  # fmt: skip
"""The fields of each case in summary.json (then the rest of compare's summary)."""
BEGIN, END = "<!-- cases:begin -->", "<!-- cases:end -->"


def case(folder: Path) -> dict[str, Any]:
    """One case, re-analysed from its runs (compare's own summary, results.csv and plot rewritten)."""
    state = read_json(folder / "compare.json")
    summary = compare.analyze(state, folder)
    if summary is None:
        raise ValueError(f"{folder}: no ok run of each arm")
    summary["stop_reason"] = state.get("stop_reason", "")
    compare.write_outputs(summary, folder)
    summary = read_json(folder / "summary.json")
    return {"case": folder.name, **{k: summary[k] for k in CASE_KEYS}, **summary}


def table(cases: list[dict[str, Any]]) -> str:
    import pandas as pd

    rows = [
        {
            "case": c["case"],
            "engine": c["engine"],
            "model": c["model"] + (" (MoE)" if c["moe"] else ""),
            f"{'variant'} / baseline": f"{c['variant']} / {c['baseline']}",
            "ratio (95% interval)": f"{c['ratio']:.4f} ({c['ci95'][0]:.4f}-{c['ci95'][1]:.4f})",
            "half-width": f"{c['half_width']:.4f}",
            "runs x steady steps": f"{c['runs']} x >= {c['steady_steps_per_run']}",
            "GPU-min": c["gpu_minutes"],
            "verdict": c["verdict"].split(": ", 1)[1] if ": " in c["verdict"] else c["verdict"],
        }
        for c in cases
    ]
    return pd.DataFrame(rows).to_markdown(index=False)


def build(report: Path) -> list[dict[str, Any]]:
    folders = sorted(p.parent for p in (report / "cases").glob("*/compare.json"))
    if not folders:
        raise ValueError(f"{report}: no cases/<case>/compare.json")
    cases = [case(f) for f in folders]
    write_json_atomic(report / "summary.json", {"cases": cases})
    import pandas as pd

    pd.DataFrame([{k: c[k] for k in ("case", *CASE_KEYS, "half_width", "cost", "verdict")} for c in cases]).to_csv(
        report / "results.csv", index=False
    )
    readme = report / "README.md"
    if readme.exists():
        text = readme.read_text()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            readme.write_text(f"{head}{BEGIN}\n{table(cases)}\n{END}{rest.split(END, 1)[1]}")
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = ArgParser(prog="python -m bench.tools.precision_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path, help="the report folder (holding cases/<case>/compare.json)")
    args = ap.parse_args(argv)
    for c in build(args.report):
        print(f"{c['case']}: {c['verdict']}")
    return 0


if __name__ == "__main__":
    from bench import entry

    sys.exit(entry.run(main))
