"""`muonbench compare` (bench.tools.compare) and the statistics it rests on (bench.results.intervals): the crossover
order, the warm-up decided from the data, the interval's coverage when runs differ from each other, the verdicts the
interval allows, the stop rule, resuming, bad input; and an A/A comparison run end to end on 2 gloo ranks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bench.results import intervals
from bench.tools import compare

TINY = ["experiment=cpu/qwen3_moe_tiny_dp2", "bench.warmup_steps=1"]


def test_crossover_order_balances_each_block_of_four() -> None:
    assert "".join(intervals.crossover_arm(i) for i in range(8)) == "ABBAABBA"


def test_warmup_is_read_from_the_step_times() -> None:
    steady = [1.30, 1.31, 1.29, 1.30, 1.32, 1.30, 1.31, 1.29, 1.30, 1.31, 1.30, 1.29]
    assert intervals.warmup_from_data([22.0, *steady]) == 1
    # a CUDA-graph capture in the third iteration is warm-up too
    assert intervals.warmup_from_data([22.0, 1.3, 2.9, *steady]) == 3
    # a late pause is not
    assert intervals.warmup_from_data([22.0, *steady, 3.0, 1.3]) == 1
    # never less than the configured warm-up
    assert intervals.warmup_from_data([1.3, *steady], floor=4) == 4


def test_ratio_and_cost_follow_the_run_statistics() -> None:
    base = [math.log(t) for t in (1.00, 1.01, 0.99)]
    var = [math.log(t) for t in (1.05, 1.06, 1.04)]
    c = intervals.compare(base, var)
    assert c.ratio == pytest.approx(1 / 1.05, rel=2e-3)
    assert c.cost == pytest.approx(1 - c.ratio)
    assert c.ci95[0] < c.ratio < c.ci95[1] < 1
    assert c.df == 4 and c.runs == (3, 3)
    one = intervals.compare(base[:1], var)
    assert one.df == 0 and math.isnan(one.half_width)


def test_interval_covers_the_truth_when_runs_differ_more_than_steps() -> None:
    """A/A by simulation: every run gets its own offset (sd 0.5%) on top of step noise (sd 1%); with 3 runs per arm
    the 95% interval holds 1 in about 95% of experiments. Treating steps as independent (what a per-step bootstrap
    does) would cover far less: checked against the same draws."""
    rng = np.random.default_rng(0)
    n_exp, runs, steps = 2000, 3, 20
    held = naive = 0
    for _ in range(n_exp):
        logs = rng.normal(0, 0.005, (2, runs, 1)) + rng.normal(0, 0.01, (2, runs, steps))
        stats = np.median(logs, axis=2)
        c = intervals.compare(stats[0], stats[1])
        held += c.ci95[0] <= 1 <= c.ci95[1]
        flat = logs.reshape(2, -1)
        se = math.sqrt(flat[0].var(ddof=1) / flat[0].size + flat[1].var(ddof=1) / flat[1].size)
        naive += abs(flat[1].mean() - flat[0].mean()) <= 1.96 * se
    assert 0.93 <= held / n_exp <= 0.97
    assert naive / n_exp < 0.8


def test_runs_needed_shrinks_with_the_spread() -> None:
    assert intervals.runs_per_arm_needed(0.0027, 0.005) == 4  # t(6) x 0.0027 x sqrt(2/4) = 0.0047
    assert intervals.runs_per_arm_needed(0.01, 0.005) > intervals.runs_per_arm_needed(0.005, 0.005)
    assert intervals.runs_per_arm_needed(math.nan, 0.005) is None



def test_verdicts_follow_the_interval() -> None:
    kw = {"variant": "muon", "baseline": "adamw"}
    wide = intervals.compare([0.0, 0.05], [0.02, 0.09])
    assert "no verdict" in intervals.verdict(wide, precision=0.005, **kw)
    assert "runs per arm" in intervals.verdict(wide, precision=0.005, **kw)
    equal = intervals.compare([0.0, 0.001, -0.001], [0.0005, -0.0005, 0.0])
    assert "no measurable cost" in intervals.verdict(equal, precision=0.005, **kw)
    step = intervals.compare([0.0, 0.001, -0.001], [0.065, 0.066, 0.064])
    fwd = intervals.compare([0.0, 0.001, -0.001], [0.0005, -0.0005, 0.0])
    text = intervals.verdict(step, precision=0.005, fwd_bwd=fwd, optim_cost=0.063, **kw)
    assert "a cost" in text and "costs its optimizer step" in text
    slower_fwd = intervals.compare([0.0, 0.001, -0.001], [0.01, 0.011, 0.009])
    text = intervals.verdict(step, precision=0.005, fwd_bwd=slower_fwd, optim_cost=0.063, **kw)
    assert "a cost" in text and "optimizer step" not in text
    faster = intervals.compare([0.0, 0.001, -0.001], [-0.03, -0.031, -0.029])
    assert "muon is faster" in intervals.verdict(faster, precision=0.005, **kw)


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["optimizer=muon"], "optimizer"),
        (["bench.steps=9"], "bench.steps"),
        (["--precision", "0"], "--precision"),
        (["--precision", "nan"], "--precision"),
        (["--min-pairs", "1"], "--min-pairs"),
        (["--bogus"], "--bogus"),
        (["model.num_layers"], "key=value"),
        (["--analyze"], "--analyze"),
    ],
)
def test_bad_input_is_one_line_and_launches_nothing(argv, names, tmp_path, capsys) -> None:
    assert compare.main([*TINY, *argv, "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and names in err[0], err
    assert not (tmp_path / "c").exists()


def _fake_run(out: Path, name: str, times: list[float]) -> dict[str, object]:
    """A run folder as bench.run writes it (run.json + steps.jsonl) with the given step times."""
    d = out / "runs" / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"run_id": name, "status": "ok", "worker": {"gpu_name": "cpu"}}))
    rows = [{"step": i, "step_s": t, "fwd_bwd_s": t * 0.9, "optim_s": t * 0.1} for i, t in enumerate(times)]
    (d / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    arm, opt = name.split("_")[1:]
    return {"dir": f"runs/{name}", "arm": arm, "optimizer": opt, "status": "ok", "returncode": 0, "seconds": 5.0}


def _seed(out: Path, spread: float) -> None:
    args, overrides = compare.parse([*TINY, "--variant", "adamw"])
    state = compare.plan(args, overrides)
    rng = np.random.default_rng(1)
    for i, arm in enumerate("ABBA"):
        offset = 1 + spread * rng.standard_normal()
        times = [3.0, *(offset * (1 + 0.001 * rng.standard_normal(8)))]
        state["runs"].append(_fake_run(out, f"{i + 1:02d}_{arm}_adamw", list(times)))
    out.mkdir(exist_ok=True)
    (out / "compare.json").write_text(json.dumps(state))


def test_stops_when_the_interval_is_narrow_enough(tmp_path, capsys) -> None:
    out = tmp_path / "aa"
    _seed(out, spread=0.0005)
    assert compare.main([*TINY, "--variant", "adamw", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["stop_reason"] == "precision reached" and s["runs"] == 4
    assert s["half_width"] <= 0.005 and s["ci95"][0] <= 1 <= s["ci95"][1]
    assert [r["warmup_steps"] for r in s["per_run"]] == [1, 1, 1, 1]  # the 3 s first step, decided from the data
    assert "no measurable cost" in capsys.readouterr().out
    # the same folder with another comparison is refused, naming what differs
    assert compare.main([*TINY, "--variant", "muon", "--out", str(out)]) == 2


def test_a_wide_interval_stops_at_the_run_limit_without_a_verdict(tmp_path, capsys) -> None:
    out = tmp_path / "wide"
    _seed(out, spread=0.05)
    assert compare.main([*TINY, "--variant", "adamw", "--max-runs", "4", "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "no verdict" in text and "--max-runs=4 reached" in text
    args, _ = compare.parse([*TINY, "--variant", "adamw"])
    line = compare.progress(json.loads((out / "summary.json").read_text()), args, 90.0)
    assert "half-width" in line and "against 0.005" in line and "1.5 of 30 min" in line
    assert "no interval yet" in compare.progress(None, args, 0.0)


def test_aa_end_to_end_on_gloo(tmp_path) -> None:
    """AdamW against itself through real bench.run processes (2 gloo ranks each), in crossover order, then a second
    call that resumes the folder and launches nothing more."""
    out = tmp_path / "aa"
    argv = [*TINY, "--variant", "adamw", "--steady-steps", "3", "--max-runs", "4", "--out", str(out)]
    rc = compare.main(argv)
    s = json.loads((out / "summary.json").read_text())
    assert rc == (0 if s["stop_reason"] == "precision reached" else 1)
    assert s["order"] == "A B B A" and s["runs"] == 4 and s["steady_steps_per_run"] >= 3
    lo, hi = s["cost_ci95"]
    assert ("no measurable cost" in s["verdict"]) == (lo <= 0 <= hi and s["half_width"] <= s["precision"])
    assert len((out / "results.csv").read_text().splitlines()) == 1 + 4 * (1 + 3 + compare.STEADY_MARGIN)
    assert (out / "compare.png").stat().st_size > 0
    assert compare.main(argv) in (0, 1)
    assert len(json.loads((out / "compare.json").read_text())["runs"]) == 4


def test_precision_report_recomputes_from_its_runs(tmp_path) -> None:
    """The committed precision report: each case re-analysed from its run records gives the committed summary, the
    megatron cases reach +-0.005 with 20+ steady steps, and the A/A interval holds 1."""
    import shutil

    from bench.tools import precision_report

    src = Path(__file__).resolve().parents[2] / "reports" / "precision_h200_202612"
    committed = {c["case"]: c for c in json.loads((src / "summary.json").read_text())["cases"]}
    shutil.copytree(src, tmp_path / "r")
    cases = {c["case"]: c for c in precision_report.build(tmp_path / "r")}
    assert cases.keys() == committed.keys()
    for name, c in cases.items():
        assert c["ratio"] == pytest.approx(committed[name]["ratio"], rel=1e-12)
        assert c["ci95"] == pytest.approx(committed[name]["ci95"], rel=1e-12)
        assert set(precision_report.CASE_KEYS) <= c.keys()
    for name in ("moe_megatron", "aa_megatron"):
        assert cases[name]["half_width"] <= 0.005 and cases[name]["steady_steps_per_run"] >= 20
    assert cases["aa_megatron"]["ci95"][0] <= 1 <= cases["aa_megatron"]["ci95"][1]
    assert (tmp_path / "r" / "README.md").read_text() == (src / "README.md").read_text()
