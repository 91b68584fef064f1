"""bench.results.report with runs that did not end ok, labels of config variants, and what the figures show."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest
from test_record_fixtures import make_run

from bench.results import collect, plots, report


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    """AdamW ok, Muon ok, Muon with 5 NS steps that diverged at step 4, MOP with a split gate/up config name."""
    root = tmp_path_factory.mktemp("runs")
    dirs = [
        make_run(root, "0_adamw", "adamw"),
        make_run(root, "1_muon", "muon", overrides=("optimizer.num_ns_steps=3",)),
        make_run(root, "2_muon", "muon", diverge_at=4, overrides=("optimizer.num_ns_steps=5",)),
        make_run(root, "3_muon_split_gate_up", "muon_split_gate_up"),
    ]
    dest = tmp_path_factory.mktemp("reports") / "fixture"
    collect.collect(dirs, dest)
    results, steps = pd.read_csv(dest / "results.csv"), pd.read_csv(dest / "steps.csv")
    return report.render(results, steps, dest, "fixture"), results, steps


def test_diverged_run_is_marked_and_never_a_ratio(diverged):
    """Localises a NaN run recorded ok, its "n/a" loss shown as a result and a Muon/AdamW ratio computed from it."""
    text, results, _ = diverged
    row = results.set_index("run_id").loc["2_muon"]
    assert row["status"] == "diverged" and row["diverged_at_step"] == 4
    table = re.sub(r" +\|", " |", text.split("## Throughput (Table 1 form)")[1].split("##")[0])  # cells unpadded
    assert "| muon num_ns_steps=5 | **diverged at step 4** | - |" in table
    ratios = report.model_only_ratios(
        results.assign(label=report.run_labels(results.to_dict("records"))).to_dict("records")
    )
    assert [r["optimizer"] for r in ratios] == ["muon num_ns_steps=3", "muon_split_gate_up"]
    assert "muon num_ns_steps=5 / adamw" not in text
    assert "loss nan at step 4" in text.split("## Runs that did not end ok")[1]


def test_labels_name_the_config_and_the_swept_values(diverged):
    """Localises optimizer=muon_split_gate_up labelled `muon` and a num_ns_steps sweep labelled by run id only."""
    _, results, _ = diverged
    assert report.run_labels(results.to_dict("records")) == [
        "adamw",
        "muon num_ns_steps=3",
        "muon num_ns_steps=5",
        "muon_split_gate_up",
    ]


def _ok_rows(results):
    rows = results[results["status"] == "ok"].to_dict("records")
    for r, lab in zip(rows, report.run_labels(rows)):
        r["label"] = lab
    return rows


def test_tflops_bars_side_by_side_never_stacked(diverged):
    """Localises NS TF/s stacked on model TF/s (a slower Muon drawn taller than AdamW)."""
    _, results, _ = diverged
    rows = _ok_rows(results)
    fig = plots.tflops_figure(rows, report._label)
    bars = fig.axes[0].patches
    assert len(bars) == 2 * len(rows) and all(b.get_y() == 0 for b in bars)
    model = {round(b.get_x() + b.get_width(), 6): b.get_height() for b in bars[: len(rows)]}
    assert list(model.values()) == pytest.approx([r["model_tflops_per_gpu"] for r in rows])
    assert "total" not in fig.axes[0].get_title()
    plots.save(fig, _tmp_png())


def _tmp_png():
    import tempfile
    from pathlib import Path

    return Path(tempfile.mkdtemp()) / "f.png"


@pytest.mark.parametrize("which", ["tflops", "breakdown", "loss"])
def test_legends_do_not_cover_the_data(diverged, which):
    """Localises a legend drawn over the bars or curves."""
    _, results, steps = diverged
    rows = _ok_rows(results)
    if which == "tflops":
        fig = plots.tflops_figure(rows, report._label)
    elif which == "breakdown":
        fig = plots.breakdown_figure(rows, report._label)
    else:
        fig = plots.curves_figure(steps, rows, "loss", "loss", report._label)
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # right of the axes, so it overlaps no bar or point
    plots.save(fig, _tmp_png())


def test_curves_are_distinguishable_and_show_the_divergence(diverged):
    """Localises overlapping loss curves drawn alike, and a diverged run's NaN points dropped so it looks healthy."""
    _, results, steps = diverged
    rows = results.to_dict("records")
    for r, lab in zip(rows, report.run_labels(rows)):
        r["label"] = lab
    shown = [r for r in rows if r["status"] in ("ok", "diverged")]
    fig = plots.curves_figure(steps, shown, "loss", "loss", report._label)
    lines = [ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")]
    curves = [ln for ln in lines if "diverged at" not in ln.get_label()]
    assert len({(ln.get_linestyle(), ln.get_marker()) for ln in curves}) == len(curves) == len(shown)
    (mark,) = [ln for ln in lines if ln.get_label() == "muon num_ns_steps=5 diverged at step 4"]
    assert list(mark.get_xdata()) == [4] and mark.get_marker() == "x"
    assert all(math.isfinite(y) for ln in curves for y in ln.get_ydata())
    assert any(ln.get_label() == "muon num_ns_steps=5 [diverged]" for ln in curves)
    plots.save(fig, _tmp_png())
