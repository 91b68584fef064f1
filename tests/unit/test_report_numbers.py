"""Every number README.md and docs/ quote from a report is generated from its `summary.json` (bench.tools.docs), and
every committed summary keeps the status rule (no ratio from a run that did not end `ok`) and quotes each ratio
with its 95% interval or, for reports older than the interval, with its spread marked `no_interval`."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from bench.tools import docs

REPO = Path(__file__).resolve().parents[2]
SUMMARIES = sorted((REPO / "reports").glob("*/summary.json"))
STATUSES = {"ok", "diverged", "error", "oom", "killed", "timeout", "skipped", "interrupted"}


def test_quotes_match_summaries():
    """Localises a number hand-edited in README.md or docs/, or a summary changed without `make docs`."""
    assert docs.stale() == []


def test_quote_of_hand_edited_number_is_caught(tmp_path: Path):
    """The check itself: a quote whose text differs from its summary is listed."""
    (tmp_path / "reports" / "r").mkdir(parents=True)
    (tmp_path / "reports" / "r" / "summary.json").write_text(json.dumps(
        {"runs": {"a": 2, "b": 2}, "steady_steps": {"a": 20, "b": 20}, "order": "A B B A",
         "ratio": 0.95, "ci95": [0.94, 0.96]}))
    (tmp_path / "docs").mkdir()
    good = "x <!-- gen r:ratio ratio:2 -->0.95 (95% interval 0.94-0.96; 2+2 runs x 10 steady steps, crossover)<!-- /gen -->"
    (tmp_path / "README.md").write_text(good)
    assert docs.stale(tmp_path) == []
    (tmp_path / "README.md").write_text(good.replace("0.95 (", "0.96 ("))
    assert len(docs.stale(tmp_path)) == 1


def test_ratio_without_interval_is_refused():
    with pytest.raises(KeyError, match="without"):
        docs.render({"x_ratio": 1.0}, "x_ratio", "ratio")
    assert docs.render({"x_ratio": 1.0, "no_interval": {"x_ratio": "one run"}}, "x_ratio", "ratio") == (
        "1.000 (no interval: one run)"
    )


def _ratios(node: Any, path: str = ""):
    """(path, container, key) of every numeric ratio in a summary: a key `ratio`, `*_ratio` or `ratio_*`."""
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(v, (dict, list)):
                yield from _ratios(v, f"{path}.{k}")
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and (
                k == "ratio" or k.endswith("_ratio") or (k.startswith("ratio_") and not k.endswith(("_ci95", "_se")))
            ):
                yield f"{path}.{k}", node, k
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _ratios(v, f"{path}[{i}]")


@pytest.mark.parametrize("summary", SUMMARIES, ids=lambda p: p.parent.name)
def test_every_ratio_has_an_interval(summary: Path):
    """Localises a ratio a report states without its 95% interval or its marked spread."""
    bare = [p for p, c, k in _ratios(json.loads(summary.read_text()))
            if docs.interval_of(c, k) is None and not docs.no_interval_of(c, k)]
    assert not bare, f"{summary.relative_to(REPO)}: ratios without an interval or a no_interval spread: {bare}"


def _status_by_run(report: Path) -> dict[str, str]:
    """Each run's recorded status: run.json files under the report, its results.csv rows, its aggregate run.json."""
    out: dict[str, str] = {}
    for rj in report.rglob("run.json"):
        rec = json.loads(rj.read_text())
        if "status" in rec:
            out[str(rj.parent.relative_to(report))] = rec["status"]
            out[rj.parent.name] = rec["status"]
            if rec.get("run_id"):
                out[rec["run_id"]] = rec["status"]
        for r in rec.get("runs", []) if isinstance(rec.get("runs"), list) else []:
            if isinstance(r, dict) and "run_id" in r and "status" in r:
                out[r["run_id"]] = r["status"]
    if (report / "results.csv").exists():
        with (report / "results.csv").open() as f:
            for row in csv.DictReader(f):
                if row.get("run_id") and row.get("status"):
                    out.setdefault(row["run_id"], row["status"])
    return out


def _used(node: Any):
    """The run references a summary's figures rest on: `runs_used` lists and each `per_run` entry's `dir`."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "runs_used":
                yield from v
            elif k == "per_run":
                yield from (r["dir"] for r in v)
            else:
                yield from _used(v)
    elif isinstance(node, list):
        for v in node:
            yield from _used(v)


@pytest.mark.parametrize("summary", SUMMARIES, ids=lambda p: p.parent.name)
def test_no_ratio_from_a_run_not_ok(summary: Path):
    """Localises a summary whose figures pool a run recorded timeout, oom, error, ...: where a report holds such a
    run, its summary must name the runs it used, and each of them ended ok."""
    report = summary.parent
    status = _status_by_run(report)
    bad = {r: s for r, s in status.items() if s != "ok"}
    used = list(_used(json.loads(summary.read_text())))
    if bad:
        assert used, f"{report.name} holds runs not ok ({sorted(bad)}) but its summary names no runs_used"
    # a per_run dir is relative to its case's folder: it matches every record whose path ends with it
    found = {r: [s for k, s in status.items() if k == r or k.endswith("/" + r)] for r in used}
    unknown = [r for r, s in found.items() if not s]
    assert not unknown, f"{report.name}: summary names runs with no record: {unknown[:5]}"
    fed = {r: s for r, s in found.items() if any(x != "ok" for x in s)}
    assert not fed, f"{report.name}: figures pool runs not ok: {fed}"


def test_every_run_record_has_a_known_status():
    """Localises a committed run record (a run.json beside its steps.jsonl) without a status, or with one outside the
    schema's set."""
    odd = []
    for rj in (REPO / "reports").glob("*/**/run.json"):
        rec = json.loads(rj.read_text())
        if (rj.parent / "steps.jsonl").exists() and rec.get("status") not in STATUSES:
            odd.append(f"{rj.relative_to(REPO)}: {rec.get('status')!r}")
    assert not odd, odd
