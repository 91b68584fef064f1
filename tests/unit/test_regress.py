"""bench.results.regress: golden-row matching, regression / suspicious-gain verdicts, exit codes, bless."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from bench import entry
from bench.results import regress

REPO = Path(__file__).resolve().parents[2]
RESULTS_COLUMNS = [
    "run_id",
    "status",
    "experiment",
    "model",
    "optimizer",
    "implementation",
    "hardware_name",
    "gpu_name",
    "config_hash",
    "git_sha",
    "start_time",
    "command",
    "step_s_median",
    "model_tflops_per_gpu",
    "optim_s_median",
    "peak_mem_bytes",
]


def _row(
    run_id: str, *, status: str = "ok", config_hash: str = "aaaa", step: float = 2.0, tf: float = 300.0
) -> dict:
    return {
        "run_id": run_id,
        "status": status,
        "experiment": "h200/fixture",
        "model": "m",
        "optimizer": "muon",
        "implementation": "ours",
        "hardware_name": "h200",
        "gpu_name": "NVIDIA H200",
        "config_hash": config_hash,
        "git_sha": "0" * 40,
        "start_time": "2026-11-29T10:00:00+00:00",
        "command": f"python -m bench.run --case {run_id}",
        "step_s_median": step,
        "model_tflops_per_gpu": tf,
        "optim_s_median": 0.3,
        "peak_mem_bytes": 1e11,
    }


def _write(path: Path, rows: list[dict], columns: list[str] = RESULTS_COLUMNS) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.fixture
def golden(tmp_path: Path) -> Path:
    """A golden file blessed from one ok run with config_hash aaaa (step 2.0 s, 300 TF/GPU)."""
    base = _write(tmp_path / "base.csv", [_row("base")])
    gold = tmp_path / "golden" / "h200.csv"
    assert regress.main(["bless", "--results", str(base), "--golden", str(gold)]) == 0
    return gold


def _compare(tmp_path: Path, golden: Path, rows: list[dict], *extra: str) -> int:
    results = _write(tmp_path / "results.csv", rows)
    return regress.main(["compare", "--results", str(results), "--golden", str(golden), *extra])


def test_within_tolerance_exits_0(tmp_path, golden, capsys):
    """Localises a check that flags ordinary noise (4% slower is inside +-5%)."""
    assert _compare(tmp_path, golden, [_row("now", step=2.08, tf=290.0)]) == 0
    out = capsys.readouterr().out
    assert "| now | step_s_median | 2 | 2.08 | +4.00 | ok |" in out and "flagged" not in out.split("==")[0]


def test_slower_step_is_regression_with_offending_config(tmp_path, golden, capsys):
    """A 6% slower step must fail (exit 1) and print the config to rerun."""
    assert _compare(tmp_path, golden, [_row("slow", step=2.12)]) == 1
    out = capsys.readouterr().out
    assert "| slow | step_s_median | 2 | 2.12 | +6.00 | **regression** |" in out
    assert "### flagged: slow (step_s_median regression)" in out
    assert "- experiment: h200/fixture" in out and "- config_hash: aaaa" in out
    assert "`python -m bench.run --case slow`" in out and "golden row: base from" in out


@pytest.mark.parametrize(
    ("step", "tf", "metric"), [(1.88, 300.0, "step_s_median"), (2.0, 318.0, "model_tflops_per_gpu")]
)
def test_too_good_is_suspicious_gain(tmp_path, golden, capsys, step, tf, metric):
    """A 6% faster step or 6% more TF/GPU is flagged too: a gain that large usually means changed work."""
    assert _compare(tmp_path, golden, [_row("fast", step=step, tf=tf)]) == 1
    out = capsys.readouterr().out
    assert f"| fast | {metric} |" in out and f"### flagged: fast ({metric} suspicious gain)" in out


def test_warn_only_exits_0_but_prints(tmp_path, golden, capsys):
    assert _compare(tmp_path, golden, [_row("slow", step=2.12)], "--warn-only") == 0
    assert "**regression**" in capsys.readouterr().out


def test_no_golden_row_listed_not_failed(tmp_path, golden, capsys):
    assert _compare(tmp_path, golden, [_row("now"), _row("new", config_hash="bbbb", step=9.0)]) == 0
    out = capsys.readouterr().out
    assert "- new: config_hash bbbb" in out and "| new |" not in out
    assert "1 compared, 0 flagged, 1 without golden row" in out


@pytest.mark.parametrize("extra", [(), ("--warn-only",)])
def test_a_comparison_of_zero_rows_fails_loudly(tmp_path, golden, capsys, extra):
    """`make regress` that compared nothing (no golden row for any run, or only failed runs) exited 0."""
    failed = _row("oom", status="oom") | {"step_s_median": "", "model_tflops_per_gpu": ""}
    assert _compare(tmp_path, golden, [_row("new", config_hash="bbbb"), failed], *extra) == 1
    captured = capsys.readouterr()
    assert "0 compared, 0 flagged, 1 without golden row" in captured.out
    assert captured.err.startswith(f"error: 0 rows of {tmp_path / 'results.csv'} compared: none is an ok run")


def test_failed_rows_listed_not_compared(tmp_path, golden, capsys):
    """Localises a check that compares the empty metrics of a crashed run (or drops it silently)."""
    failed = _row("oom", status="oom", config_hash="bbbb") | {"step_s_median": "", "model_tflops_per_gpu": ""}
    assert _compare(tmp_path, golden, [_row("now"), failed]) == 0
    out = capsys.readouterr().out
    assert "- oom: status oom" in out and "| oom |" not in out


@pytest.mark.parametrize("extra", [(), ("--warn-only",)])
def test_a_failed_run_with_a_golden_row_fails(tmp_path, golden, capsys, extra):
    """Localises `regress compare` exiting 0 when a workload that has a golden row now ends `error`."""
    failed = _row("err", status="error") | {"step_s_median": "", "model_tflops_per_gpu": ""}
    assert _compare(tmp_path, golden, [_row("now"), failed], *extra) == 1
    captured = capsys.readouterr()
    assert "- err: status error (**has a golden row**)" in captured.out
    assert captured.err == "error: err ended error but has a golden row\n"


def test_a_run_with_every_metric_blank_fails(tmp_path, golden, capsys):
    """Localises a run whose four verdicts are all `n/a` counting as compared and passing."""
    blank = _row("now") | dict.fromkeys(regress.METRICS, "")
    assert _compare(tmp_path, golden, [blank]) == 1
    assert capsys.readouterr().err == "error: now: every metric is blank (nothing compared)\n"


@pytest.mark.parametrize("value", ["nan", "-0.05", "inf", "abc"])
@pytest.mark.parametrize("flag", ["--tolerance", "--min-delta-s"])
def test_bad_tolerance_is_refused_in_one_line(tmp_path, golden, capsys, flag, value):
    """Localises `--tolerance nan` passing a 3x slowdown and a negative tolerance flagging everything."""
    assert entry.run(lambda: _compare(tmp_path, golden, [_row("now", step=6.0)], f"{flag}={value}")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag}: {value!r}" in err


def test_missing_column_exits_2_naming_it(tmp_path, golden, capsys):
    columns = [c for c in RESULTS_COLUMNS if c != "peak_mem_bytes"]
    results = _write(tmp_path / "results.csv", [_row("x")], columns)
    assert regress.main(["compare", "--results", str(results), "--golden", str(golden)]) == 2
    err = capsys.readouterr().err
    assert "peak_mem_bytes" in err and str(results) in err
    assert regress.main(["compare", "--results", str(tmp_path / "nope.csv"), "--golden", str(golden)]) == 2
    assert "nope.csv: file not found" in capsys.readouterr().err


def test_bless_adds_and_replaces_same_key(tmp_path, golden):
    rows = [_row("again", step=2.5), _row("other", config_hash="cccc")]
    results = _write(tmp_path / "r2.csv", rows)
    assert regress.main(["bless", "--results", str(results), "--golden", str(golden)]) == 0
    stored = {r["run_id"]: r for r in regress.read_rows(golden, regress.GOLDEN_COLUMNS)}
    assert sorted(stored) == ["again", "other"]
    assert float(stored["again"]["step_s_median"]) == 2.5 and stored["again"]["source"].endswith("r2.csv")
    assert stored["again"]["blessed_at"].endswith("+00:00") and stored["again"]["command"].endswith("again")


def test_bless_refuses_non_ok_or_unknown_run(tmp_path, golden, capsys):
    results = _write(tmp_path / "r3.csv", [_row("ok1", config_hash="dddd"), _row("bad", status="error")])
    before = golden.read_text()
    argv = ["bless", "--results", str(results), "--golden", str(golden), "--runs"]
    assert regress.main([*argv, "ok1", "bad"]) == 2
    assert "bad (status error)" in capsys.readouterr().err
    assert regress.main([*argv, "ghost"]) == 2
    assert "unknown run_id(s) ['ghost']" in capsys.readouterr().err
    assert golden.read_text() == before


def test_blessed_rows_reproduce_themselves_and_other_configs_have_no_golden(tmp_path):
    """A golden file blessed from a results file compares with that file at zero change on every metric; a rerun
    within tolerance is ok; a run of another configuration is listed under no_golden, not compared."""
    rows = [_row("adamw", config_hash="a1"), _row("muon", config_hash="m1", step=2.1, tf=290.0)]
    gold = tmp_path / "g.csv"
    assert (
        regress.main(["bless", "--results", str(_write(tmp_path / "r.csv", rows)), "--golden", str(gold)])
        == 0
    )
    golden = regress.read_rows(gold, regress.GOLDEN_NEEDED)
    same = regress.compare(regress.read_rows(tmp_path / "r.csv", regress.RESULTS_NEEDED), golden)
    assert {c.change for c in same.checks} == {0.0} and len(same.checks) == 2 * 4
    rerun = [_row("muon_again", config_hash="m1", step=2.12, tf=288.0), _row("other", config_hash="x9")]
    cmp = regress.compare(
        regress.read_rows(_write(tmp_path / "n.csv", rerun), regress.RESULTS_NEEDED), golden
    )
    assert {c.verdict for c in cmp.checks} == {"ok"} and {c.run_id for c in cmp.checks} == {"muon_again"}
    assert [r["run_id"] for r in cmp.no_golden] == ["other"]


def test_committed_golden_files_are_well_formed():
    """Every committed golden file has the columns `regress` needs and one row per (config, hardware, GPU) key."""
    files = sorted((REPO / "reports/golden").glob("*.csv"))
    assert files
    for path in files:
        rows = regress.read_rows(path, regress.GOLDEN_NEEDED)
        keys = [regress.key_of(r) for r in rows]
        assert rows and len(set(keys)) == len(keys), path


def test_small_time_changes_below_the_floor_are_noise(tmp_path, capsys):
    """Localises a flat relative tolerance on a small time: a 15 ms wobble of a 0.1 s optimizer step (15%) is not
    flagged under the default 20 ms floor, and is with --min-delta-s 0."""
    base = _row("base") | {"optim_s_median": 0.100}
    gold = tmp_path / "g.csv"
    assert (
        regress.main(["bless", "--results", str(_write(tmp_path / "b.csv", [base])), "--golden", str(gold)])
        == 0
    )
    now = [_row("now") | {"optim_s_median": 0.115}]
    assert _compare(tmp_path, gold, now) == 0
    assert "| now | optim_s_median | 0.1 | 0.115 | +15.00 | ok |" in capsys.readouterr().out
    assert _compare(tmp_path, gold, now, "--min-delta-s", "0") == 1
    assert "**regression**" in capsys.readouterr().out


def test_bless_into_an_unwritable_place_is_one_line(tmp_path, capsys):
    """Localises `regress bless --golden <file>/x.csv` ending in a NotADirectoryError traceback."""
    results = _write(tmp_path / "results.csv", [_row("base")])
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = regress.main(["bless", "--results", str(results), "--golden", str(blocker / "x.csv")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {blocker / 'x.csv'}: cannot write") and err.count("\n") == 1
