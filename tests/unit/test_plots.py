"""bench.results.plots.step_times_figure on real `bench.tools.optim_step` results (CPU, tiny shapes)."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def step_results():
    from bench.tools import optim_step

    kw = {
        "device": "cpu",
        "scale": 1 / 64,
        "repeats": 2,
        "warmup": 0,
        "impls": ("adamw_foreach", "optim_muon"),
    }
    return [optim_step.run(layout=layout, **kw) for layout in ("buckets", "separate")]


def test_step_times_figure_one_bar_per_result_and_impl(step_results, tmp_path):
    from bench.results.plots import save, step_times_figure

    fig = step_times_figure(step_results, target_ms=30)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["adamw_foreach", "optim_muon"]
    bars = [p for p in ax.patches if p.get_width() > 0]
    assert len(bars) == 4  # 2 impls x 2 layouts
    widths = sorted(round(b.get_width(), 6) for b in bars)
    medians = sorted(round(r["median_ms"], 6) for res in step_results for r in res["rows"])
    assert widths == medians
    labels = ax.get_legend_handles_labels()[1]
    assert (
        labels[0] == "30 ms"
        and "buckets, 0 warm-up steps" in labels
        and "separate, 0 warm-up steps" in labels
    )
    save(fig, tmp_path / "steps.png")
    assert (tmp_path / "steps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_step_times_figure_impl_missing_from_one_result(step_results):
    from bench.results.plots import step_times_figure

    only_muon = dict(step_results[1], rows=[r for r in step_results[1]["rows"] if r["impl"] == "optim_muon"])
    ax = step_times_figure([step_results[0], only_muon]).axes[0]
    assert len([p for p in ax.patches if p.get_width() > 0]) == 3
    assert not any(line.get_linestyle() == "--" for line in ax.get_lines())  # no target given, no target line
