"""The crossover analysis (bench.tools.crossover) on the committed H200 Bridge runs and on edited copies."""

import json
import shutil
from pathlib import Path

import pytest

from bench.tools import crossover

RUNS = Path(__file__).resolve().parents[2] / "reports" / "bridge_crossover_h200_202612" / "runs"


def test_committed_sequence_reproduces_the_report(tmp_path):
    """Localises a report whose numbers the committed run records no longer give."""
    assert crossover.main([str(RUNS), "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    committed = json.loads((RUNS.parent / "summary.json").read_text())
    assert s["order"] == "A B B A A B" and s["steady_steps"] == {"adamw": 9, "muon": 9}
    assert s["ratio_model_only"] == pytest.approx(23.473723049 / 22.899436922000064)
    # runs 1-2: AdamW 24.96 s vs ours 23.32 s (medians of the steady steps 3-5)
    assert len(s["pair_ratios"]) == 3 and s["pair_ratios"][0] == pytest.approx(24.964 / 23.321, rel=1e-4)
    assert s == committed
    lo, hi = s["ratio_model_only_ci95"]
    assert lo < s["ratio_model_only"] < hi
    assert len((tmp_path / "results.csv").read_text().splitlines()) == 1 + 18
    assert (tmp_path / "crossover.png").stat().st_size > 0


def test_a_run_that_did_not_end_ok_does_not_count(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(RUNS, runs)
    first = min(runs.glob("*adamw/run.json"))
    rec = json.loads(first.read_text())
    rec["status"] = "oom"
    first.write_text(json.dumps(rec))
    s = crossover.summarize(crossover.load_runs(runs), "adamw")
    assert s["runs"] == {"adamw": 2, "muon": 3} and s["order"] == "B B A A B"
    assert s["pair_ratios"] == []  # runs 1-2 and 3-4 now hold one optimizer each: no full pair


def test_wrong_baseline_is_a_one_line_error(tmp_path, capsys):
    assert crossover.main([str(RUNS), "--baseline", "sgd", "--out", str(tmp_path)]) == 2
    assert "--baseline='sgd': need exactly two optimizers" in capsys.readouterr().err
    assert crossover.main([str(tmp_path / "empty")]) == 2


@pytest.mark.parametrize("damage", ["[]", "{not json", '{"status": "ok"}', None])
def test_a_corrupted_run_folder_names_its_file(tmp_path, capsys, damage):
    """Localises a traceback (AttributeError, JSONDecodeError, KeyError, a missing steps.jsonl) on one bad record."""
    runs = tmp_path / "runs"
    shutil.copytree(RUNS, runs)
    bad = min(runs.glob("*/run.json"))
    if damage is None:
        (bad.parent / "steps.jsonl").unlink()
    else:
        bad.write_text(damage)
    assert crossover.main([str(runs), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: not a readable run record") and err.count("\n") == 1


def test_ok_runs_one_level_down_are_found(tmp_path):
    """Localises "no ok run" for a sweep folder whose run folders sit under one more folder."""
    shutil.copytree(RUNS, tmp_path / "sweep" / "runs")
    assert crossover.main([str(tmp_path / "sweep"), "--out", str(tmp_path)]) == 0
