"""bench.report: Table-1 form with the model-only figures, the ratio, the breakdown, failed runs and the PNGs."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from test_record_fixtures import STEP_S, make_fixture_runs

from bench import collect, report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    dest = tmp_path_factory.mktemp("reports") / "fixture"
    results, _steps = collect.collect(make_fixture_runs(root), dest)
    text = report.render(pd.read_csv(dest / "results.csv"), pd.read_csv(dest / "steps.csv"), dest, "fixture")
    return text, dest, results


def test_table1_shows_total_as_model_plus_ns(rendered):
    """Localises NS FLOPs folded into the model figure (the published-sum-only anti-pattern)."""
    text, _, results = rendered
    muon = results.set_index("run_id").loc["1_muon"]
    model, ns = muon["model_tflops_per_gpu"], muon["ns_tflops_per_gpu"]
    form = f"{report.fmt(model + ns)} = {report.fmt(model)} + {report.fmt(ns)}"
    assert form in text
    assert "N/A (no peak for this hardware)" in text


def test_model_only_ratio_against_adamw(rendered):
    text, _, _ = rendered
    steady_ratio = STEP_S["adamw"] / STEP_S["muon"]
    m = re.search(r"muon \(1_muon\) / adamw: model-only ratio ([0-9.]+)", text)
    assert m is not None
    assert float(m.group(1)) == pytest.approx(steady_ratio, abs=0.01)


def test_breakdown_and_failed_runs_and_protocol(rendered):
    text, _, _ = rendered
    assert "## Optimizer step breakdown" in text
    section = text.split("## Optimizer step breakdown")[1]
    row = next(line for line in section.splitlines() if line.startswith("| muon (1_muon) |"))
    assert "| 20.00 | 2.00 |" in row  # NS ms, AdamW-part ms
    assert "## Failed runs" in text and "FileNotFoundError" in text
    assert "warm-up steps excluded" in text and "median" in text and "IQR" in text


def test_plots_are_written_from_files(rendered):
    _, dest, _ = rendered
    for name in report.PLOTS:
        data = (dest / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000, name
    assert (dest / "report.md").read_text().count("](") >= len(report.PLOTS)


def test_report_cli_errors_without_results(tmp_path, capsys):
    assert report.main(["--name", "missing", "--reports", str(tmp_path)]) == 2
    assert "bench.collect" in capsys.readouterr().err
