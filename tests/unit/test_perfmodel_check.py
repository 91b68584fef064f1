"""`bench.tools.perfmodel.check`: measured step times against the intervals `muonbench compare` recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.tools.perfmodel import check

PROFILE = "hardware profile nvidia_h100 (user: /p.json; NVIDIA H100 80GB HBM3, 2026-12-01)"


def summary(steps_a: list[float], steps_b: list[float], *, profile: str = PROFILE, lo: float = 0.95) -> dict:
    def arm(pred: float) -> dict:
        return {"step_time_s": pred, "step_time_s_interval": [pred * lo, pred * 1.05], "hardware_profile": profile}

    return {
        "model": "mixtral_8x7b", "engine": "megatron", "gpu": "NVIDIA H100 80GB HBM3",
        "baseline": "adamw", "variant": "muon", "predicted": {"A": arm(1.0), "B": arm(1.1)},
        "per_run": [{"arm": "A", "step_s_median": s} for s in steps_a] + [{"arm": "B", "step_s_median": s} for s in steps_b],
    }  # fmt: skip


def write(folder: Path, content: dict) -> Path:
    (folder / "cases" / "c").mkdir(parents=True)
    (folder / "cases" / "c" / "summary.json").write_text(json.dumps(content))
    return folder


@pytest.mark.parametrize(
    ("content", "passed"),
    [
        (summary([1.01, 0.99, 1.0], [1.12, 1.08]), True),
        (summary([1.01, 0.99, 1.0], [1.30, 1.25]), False),  # Muon measured outside its interval
        (summary([1.0, 1.0], [1.1, 1.1], lo=0.85), False),  # an interval wider than +-10%
        (summary([1.0, 1.0], [1.1, 1.1], profile="not calibrated: no hardware profile for h100"), False),
    ],
)
def test_a_case_passes_only_inside_a_narrow_calibrated_interval(tmp_path: Path, content: dict, passed: bool) -> None:
    folder = write(tmp_path, content)
    assert check.main([str(folder)]) == (0 if passed else 1)
    result = json.loads((folder / "summary.json").read_text())
    assert result["passed"] is passed and (folder / "run.json").is_file()


def test_a_folder_without_cases_or_predictions_is_refused_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check.main([str(tmp_path)]) == 2
    content = summary([1.0], [1.1])
    del content["predicted"]["B"]
    write(tmp_path, content)
    assert check.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "cases: no compare folder" in err[0] and "arm B (muon): no prediction" in err[1]
    assert not (tmp_path / "summary.json").exists()
