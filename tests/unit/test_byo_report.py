"""`bench.tools.byo_report` on the committed H200 runs of reports/byo_models_h200_202612: every run beside its
prediction, the crossover ratio per model and engine."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

REPORT = Path(__file__).resolve().parents[2] / "reports" / "byo_models_h200_202612"


def test_report_from_committed_runs(tmp_path: Path) -> None:
    from bench.tools.byo_report import main

    assert main([str(REPORT / "runs"), "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(rows) == 24 and {r["status"] for r in rows} == {"ok"}
    assert {(r["model"], r["engine"]) for r in rows} == {
        (m, e) for m in ("llama3_8b", "olmoe_1b_7b", "qwen3_8b") for e in ("megatron", "bridge")
    }
    for r in rows:  # the prediction is the performance model's for that run's resolved config
        assert float(r["predicted_step_s"]) > 0
        assert float(r["step_rel_error"]) == pytest.approx(
            float(r["predicted_step_s"]) / float(r["step_s_median"]) - 1, abs=1e-5
        )
    summary = json.loads((tmp_path / "summary.json").read_text())
    llama = summary["llama3_8b/bridge"]
    assert llama["order"] == "A B B A" and llama["variant"] == "muon"
    assert summary["olmoe_1b_7b/bridge"]["order"] == "A B B A A B"
    assert summary["qwen3_8b/megatron"]["order"] == summary["qwen3_8b/bridge"]["order"] == "A B B A"
    for s in summary.values():  # an interval needs two runs of each arm; one pair has none
        lo, hi = s["ratio_model_only_ci95"]
        if min(s["runs"].values()) >= 2:
            assert lo <= s["ratio_model_only"] <= hi
        else:
            assert math.isnan(lo) and math.isnan(hi)
    assert (tmp_path / "predicted_vs_measured.png").stat().st_size > 0
    assert len(json.loads((tmp_path / "run.json").read_text())["runs"]) == 24
    # the committed summary is what the tool writes from the committed runs
    assert json.loads((REPORT / "summary.json").read_text()) == summary


def test_no_runs_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.tools.byo_report import main

    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "no run.json under" in capsys.readouterr().err
