"""Committed reports change only through an explicit command: `make quality` writes a fresh folder under runs/,
`make bench-example` takes only a complete smoke sweep, and a report removes the plots it no longer draws."""

from __future__ import annotations

import pandas as pd
import pytest
from test_record_fixtures import make_fixture_runs

from bench.results import collect, record, report
from bench.tools.quality.config import fresh_out, parse_cli

SMOKE = "-m optimizer=adamw,muon experiment=cpu/qwen3_moe_tiny_dp2"


def test_quality_defaults_to_a_fresh_folder_under_runs(tmp_path):
    """Localises `make quality` resuming the committed reports/quality_cpu_202612 (training nothing, printing
    another host's numbers and rewriting tracked files)."""
    for profile in ("cpu", "gpu", "tiny"):
        out = parse_cli([f"profile={profile}"]).out
        assert out.startswith(f"runs/quality_{profile}_"), out
    assert parse_cli(["out=reports/x"]).out == "reports/x"  # the explicit command
    first = fresh_out("cpu", root=str(tmp_path))
    (tmp_path / first.rsplit("/", 1)[1]).mkdir()
    assert fresh_out("cpu", root=str(tmp_path)) != first


def _manifest(argv, state="complete"):
    return {"argv": argv, "state": state}


def test_the_example_report_is_made_only_from_the_smoke_sweep(tmp_path):
    """Localises `make bench-example` rewriting the committed example from whatever sweep ran last."""
    import shlex

    smoke = shlex.split(SMOKE)
    collect.check_command(_manifest(smoke), SMOKE, tmp_path / "LATEST.json")
    collect.check_command(_manifest([*smoke, "bench.resume=runs/LATEST.json"]), SMOKE, tmp_path)
    for bad in (
        _manifest(["-m", "optimizer=adamw,muon,soap_rekls", "experiment=cpu/qwen3_moe_tiny_dp2"]),
        _manifest([*smoke, "bench.steps=3"]),
        _manifest(smoke, state="interrupted"),
    ):
        with pytest.raises(ValueError, match="this report is made only from a complete"):
            collect.check_command(bad, SMOKE, tmp_path / "LATEST.json")
    dirs = make_fixture_runs(tmp_path / "runs")
    record.write_json_atomic(
        tmp_path / "runs" / "LATEST.json",
        {"argv": ["optimizer=adamw"], "state": "complete", "runs": [str(d) for d in dirs]},
    )
    reports = tmp_path / "reports"
    args = ["--out-dir", str(tmp_path / "runs"), "--reports", str(reports), "--name", "example"]
    assert collect.main([*args, "--expect-command", SMOKE]) == 2
    assert not reports.exists()


def test_a_report_removes_the_plots_it_does_not_draw(tmp_path):
    """Localises a rewritten report keeping an earlier report's plots of runs it no longer has."""
    dirs = make_fixture_runs(tmp_path / "runs")
    dest = tmp_path / "report"
    collect.collect(dirs, dest)
    report.render(pd.read_csv(dest / "results.csv"), pd.read_csv(dest / "steps.csv"), dest, "x")
    assert (dest / "tflops.png").exists()
    for d in dirs:
        record.update_run_json(d, status="error", summary=None)
    collect.collect(dirs, dest)
    report.render(pd.read_csv(dest / "results.csv"), pd.read_csv(dest / "steps.csv"), dest, "x")
    assert not (dest / "tflops.png").exists() and not (dest / "step_breakdown.png").exists()
