"""Prediction of the single-H200 Megatron slice measurement (issue 7), when its report exists."""

from __future__ import annotations

from pathlib import Path

MEGATRON_REPORT = Path(__file__).resolve().parents[2] / "reports" / "megatron_h200_202611"


def compare(path: Path = MEGATRON_REPORT) -> str:
    """Markdown paragraph: the comparison, or that the measurement is pending."""
    if not (path / "results.csv").exists():
        return (f"Pending: `{path.relative_to(path.parents[1])}/results.csv` does not exist yet (the Megatron "
                "helper's single-H200 run). The prediction for its configs: `python -m bench.project "
                "experiment=h200/qwen3_30b_a3b_slice_muon_1gpu profile=ours`.")
    return f"`{path.name}/results.csv` exists; comparison not implemented for its format yet."
