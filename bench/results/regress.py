"""Regression check: compare a report's runs with stored golden rows and flag changes beyond a tolerance.

    python -m bench.results.regress compare --results reports/<name>/results.csv --golden reports/golden/h200.csv
    python -m bench.results.regress bless --results reports/<name>/results.csv --golden reports/golden/h200.csv --runs ID ...

A run matches a golden row by (config_hash, hardware_name, gpu_name); `config_hash` leaves out the `bench` group
(step counts, output paths), so a rerun of the same workload with another step count still matches. Step time,
optimizer-step time and peak memory are worse when higher, model TFLOP/s per GPU when lower. A relative change
beyond the tolerance (default 5%) in the bad direction is a regression; in the good direction a suspicious gain
(too good to be true needs a look). After Megatron-Bridge `scripts/performance/utils/evaluate.py`. No torch import.
Exit 0: nothing flagged (or --warn-only); 1: something flagged, a run with a golden row failed, or a compared run
has no metric value at all; 2: a file, a column or an argument is bad, or bless refused.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench import entry, metrics
from bench.entry import ArgParser
from bench.results import record
from muonbench.cli_help import command

KEY: tuple[str, ...] = ("config_hash", "hardware_name", "gpu_name")
"""Columns that identify the workload on a machine."""
METRICS: dict[str, bool] = metrics.regressed()
"""Compared summary column -> True when a higher value is worse (`bench.metrics`)."""
PROVENANCE: tuple[str, ...] = ("run_id", "experiment", "model", "optimizer", "implementation")
RUN_INFO: tuple[str, ...] = ("git_sha", "start_time", "command")
GOLDEN_COLUMNS: tuple[str, ...] = (*KEY, *PROVENANCE, *METRICS, *RUN_INFO, "source", "blessed_at")
"""Columns of a golden file, in order."""
RESULTS_NEEDED: tuple[str, ...] = (*KEY, "run_id", "status", "experiment", "command", *METRICS)
BLESS_NEEDED: tuple[str, ...] = (*KEY, *PROVENANCE, *METRICS, *RUN_INFO, "status")
GOLDEN_NEEDED: tuple[str, ...] = (*KEY, "run_id", *METRICS, "source")

Row = dict[str, str]
FLAGS: tuple[str, ...] = ("regression", "suspicious gain")
"""Verdicts that flag a run."""


class RegressError(ValueError):
    """A missing file or column, or a refused bless; names the file, the column or the run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One metric of one run against its golden row."""

    run_id: str
    metric: str
    golden: float | None
    now: float | None
    change: float | None
    """Relative change (now - golden) / golden; None when a value is missing or the golden value is 0."""
    verdict: str
    """ok | regression | suspicious gain | n/a"""


@dataclass(slots=True, kw_only=True)
class Comparison:
    """Outcome of `compare`: per-metric checks, flagged run pairs and the rows not compared."""

    checks: list[Check]
    flagged: list[tuple[Row, Row]]
    """(results row, golden row) of every run with at least one flagged metric."""
    no_golden: list[Row]
    failed: list[Row]
    failed_golden: list[Row] = field(default_factory=list)
    """Failed rows that have a golden row: a run that used to work and now does not."""
    blank: list[str] = field(default_factory=list)
    """run_ids compared whose every metric is missing (nothing was checked)."""


def read_rows(path: Path, needed: tuple[str, ...]) -> list[Row]:
    """Rows of a CSV as string dicts; `RegressError` naming the file when it or a needed column is missing."""
    if not path.is_file():
        raise RegressError(f"{path}: file not found")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in needed if c not in (reader.fieldnames or [])]
        if missing:
            raise RegressError(f"{path}: missing column(s) {missing} (needed: {list(needed)})")
        return list(reader)


def key_of(row: Row) -> tuple[str, ...]:
    """The (config_hash, hardware_name, gpu_name) key of a results or golden row."""
    return tuple(row[k] for k in KEY)


def _num(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return None if math.isnan(v) else v


def check_metric(
    run_id: str, metric: str, golden: str, now: str, tolerance: float, min_delta_s: float = 0.0
) -> Check:
    """Compare one metric; beyond `tolerance` in the bad direction is a regression, in the good one a gain. A time
    metric (`*_s_median`) that moved by less than `min_delta_s` seconds is within noise whatever its relative change
    (a 15 ms wobble of a 0.1 s AdamW step is 15%)."""
    g, n = _num(golden), _num(now)
    if g is None or n is None or g == 0:
        return Check(run_id=run_id, metric=metric, golden=g, now=n, change=None, verdict="n/a")
    change = (n - g) / g
    worse = change if METRICS[metric] else -change
    verdict = "regression" if worse > tolerance else "suspicious gain" if worse < -tolerance else "ok"
    if metric.endswith("_s_median") and abs(n - g) < min_delta_s:
        verdict = "ok"
    return Check(run_id=run_id, metric=metric, golden=g, now=n, change=change, verdict=verdict)


def compare(
    results: list[Row], golden: list[Row], *, tolerance: float = 0.05, min_delta_s: float = 0.0
) -> Comparison:
    """Match each ok results row to its golden row by `KEY` and check the four metrics."""
    by_key = {key_of(g): g for g in golden}
    out = Comparison(checks=[], flagged=[], no_golden=[], failed=[])
    for row in results:
        gold = by_key.get(key_of(row))
        if row["status"] != "ok":
            out.failed.append(row)
            if gold is not None:
                out.failed_golden.append(row)
            continue
        if gold is None:
            out.no_golden.append(row)
            continue
        checks = [check_metric(row["run_id"], m, gold[m], row[m], tolerance, min_delta_s) for m in METRICS]
        out.checks.extend(checks)
        if all(c.verdict == "n/a" for c in checks):
            out.blank.append(row["run_id"])
        if any(c.verdict in FLAGS for c in checks):
            out.flagged.append((row, gold))
    return out


def _fmt(metric: str, v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if metric == "peak_mem_bytes" else f"{v:.6g}"


def _offending(row: Row, gold: Row, checks: list[Check]) -> list[str]:
    """The offending config of a flagged run and the provenance of its golden row."""
    bad = ", ".join(
        f"{c.metric} {c.verdict}" for c in checks if c.run_id == row["run_id"] and c.verdict in FLAGS
    )
    blessed = f"git {gold.get('git_sha', '')[:12] or '-'}, {gold.get('start_time') or '-'}"
    return [
        "",
        f"### flagged: {row['run_id']} ({bad})",
        f"- experiment: {row['experiment'] or '-'}",
        f"- config_hash: {row['config_hash']} ({row['hardware_name']}, {row['gpu_name'] or '-'})",
        f"- command: `{row['command']}`",
        f"- golden row: {gold['run_id']} from {gold['source']} ({blessed}; blessed {gold.get('blessed_at') or '-'})",
    ]


def render(cmp: Comparison, *, results_path: Path, golden_path: Path, tolerance: float) -> str:
    """Markdown: the metric table, the offending configs, the rows without golden row and the failed rows."""
    lines = [
        f"## regression check: {results_path} vs {golden_path} (tolerance +-{tolerance:.0%})",
        "",
        "| run_id | metric | golden | now | change % | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for c in cmp.checks:
        change = "-" if c.change is None else f"{c.change * 100:+.2f}"
        verdict = f"**{c.verdict}**" if c.verdict in FLAGS else c.verdict
        values = f"{_fmt(c.metric, c.golden)} | {_fmt(c.metric, c.now)}"
        lines.append(f"| {c.run_id} | {c.metric} | {values} | {change} | {verdict} |")
    for row, gold in cmp.flagged:
        lines += _offending(row, gold, cmp.checks)
    if cmp.no_golden:
        lines += ["", "### no golden row (not compared, not a failure)"]
        lines += [
            f"- {r['run_id']}: config_hash {r['config_hash']} ({r['experiment'] or '-'})"
            for r in cmp.no_golden
        ]
    if cmp.failed:
        lines += ["", "### failed runs (status != ok, not compared)"]
        covered = {id(r) for r in cmp.failed_golden}
        lines += [
            f"- {r['run_id']}: status {r['status']}{' (**has a golden row**)' if id(r) in covered else ''}"
            for r in cmp.failed
        ]
    num_compared = len({c.run_id for c in cmp.checks})
    counts = f"{len(cmp.flagged)} flagged, {len(cmp.no_golden)} without golden row, {len(cmp.failed)} failed"
    lines += ["", f"== {num_compared} compared, {counts}"]
    return "\n".join(lines)


def bless(results_path: Path, golden_path: Path, *, run_ids: list[str] | None = None) -> list[str]:
    """Add ok rows of `results_path` (all, or the named run_ids in that order) to the golden file.

    A row with the same key replaces the stored one. Refuses a non-ok row or an unknown run_id. Returns notes,
    one per added or replaced row.
    """
    results = read_rows(results_path, BLESS_NEEDED)
    by_id = {r["run_id"]: r for r in results}
    if run_ids:
        unknown = [r for r in run_ids if r not in by_id]
        if unknown:
            raise RegressError(f"{results_path}: unknown run_id(s) {unknown} (known: {sorted(by_id)})")
        chosen = [by_id[r] for r in run_ids]
        not_ok = [f"{r['run_id']} (status {r['status']})" for r in chosen if r["status"] != "ok"]
        if not_ok:
            raise RegressError(f"{results_path}: refusing to bless runs whose status is not ok: {not_ok}")
    else:
        chosen = [r for r in results if r["status"] == "ok"]
    golden = read_rows(golden_path, GOLDEN_COLUMNS) if golden_path.exists() else []
    stored = {key_of(g): g for g in golden}
    source = os.path.relpath(results_path.resolve()) if results_path.is_absolute() else str(results_path)
    stamp, notes = {"source": source, "blessed_at": record.now_iso()}, []
    for row in chosen:
        new = {c: row[c] for c in GOLDEN_COLUMNS if c in row} | stamp
        old = stored.get(key_of(row))
        was = f"replaces {old['run_id']} from {old['source']}" if old else "added"
        notes.append(f"{row['run_id']}: {was} (config_hash {row['config_hash']})")
        stored[key_of(row)] = new
    write_csv_atomic(golden_path, list(stored.values()))
    return notes


def write_csv_atomic(path: Path, rows: list[Row]) -> None:
    """Write golden rows to `path` via a temp file in the same directory and `os.replace`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(GOLDEN_COLUMNS), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def failures(cmp: Comparison) -> list[str]:
    """Why a comparison fails whatever the tolerance: failed runs with a golden row, runs with no metric value."""
    out = [f"{r['run_id']} ended {r['status']} but has a golden row" for r in cmp.failed_golden]
    return out + [f"{run_id}: every metric is blank (nothing compared)" for run_id in cmp.blank]


def _fraction(text: str) -> float:
    """argparse type of --tolerance / --min-delta-s: a finite number >= 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return v


def main(argv: list[str] | None = None) -> int:
    """CLI entry: `compare` or `bless`; returns the exit status."""
    ap = ArgParser(prog=command("bench.results.regress"), description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    cp = sub.add_parser("compare", help="compare results.csv with golden rows")
    bp = sub.add_parser("bless", help="add ok rows of results.csv to a golden file")
    for p in (cp, bp):
        p.add_argument("--results", type=Path, required=True, help="reports/<name>/results.csv")
        p.add_argument("--golden", type=Path, required=True, help="reports/golden/<file>.csv")
    cp.add_argument("--tolerance", type=_fraction, default=0.05, help="relative tolerance (default 0.05)")
    cp.add_argument("--warn-only", action="store_true", help="print flagged rows but exit 0")
    cp.add_argument(
        "--min-delta-s",
        type=_fraction,
        default=0.02,
        help="time metrics that moved by less than this many seconds are not flagged (default 0.02)",
    )
    bp.add_argument("--runs", nargs="+", metavar="RUN_ID", help="run_ids to bless (default: every ok row)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "bless":
            try:
                notes = bless(args.results, args.golden, run_ids=args.runs)
            except OSError as exc:
                raise RegressError(f"{args.golden}: cannot write ({exc.strerror or exc})") from None
            for note in notes:
                print(f"bless {note}")
            print(f"== golden rows -> {args.golden}")
            return 0
        results = read_rows(args.results, RESULTS_NEEDED)
        golden = read_rows(args.golden, GOLDEN_NEEDED)
    except RegressError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cmp = compare(results, golden, tolerance=args.tolerance, min_delta_s=args.min_delta_s)
    print(render(cmp, results_path=args.results, golden_path=args.golden, tolerance=args.tolerance))
    if not cmp.checks:  # a check that checked nothing does not pass, --warn-only or not
        print(
            f"error: 0 rows of {args.results} compared: none is an ok run with a golden row in {args.golden} "
            "(bless one, or pick the golden file of this hardware)",
            file=sys.stderr,
        )
        return 1
    for why in failures(cmp):
        print(f"error: {why}", file=sys.stderr)
    return 1 if failures(cmp) or (cmp.flagged and not args.warn_only) else 0


if __name__ == "__main__":
    raise SystemExit(entry.run(main))
