"""bench.results.report: Table-1 form with the model-only figures, the ratio, the breakdown, failed runs and the PNGs."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from test_record_fixtures import STEP_S, make_fixture_runs

from bench.results import collect, report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    dest = tmp_path_factory.mktemp("reports") / "fixture"
    results, _steps = collect.collect(make_fixture_runs(root), dest)
    text = report.render(pd.read_csv(dest / "results.csv"), pd.read_csv(dest / "steps.csv"), dest, "fixture")
    return text, dest, results


def unpad(text: str) -> str:
    """A Markdown table without the padding of its cells (`to_markdown` aligns the columns)."""
    return re.sub(r" +\|", " |", text)


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
    row = next(line for line in unpad(section).splitlines() if line.startswith("| muon (1_muon) |"))
    assert "| 20.00 | 2.00 |" in row  # NS ms, AdamW-part ms
    assert "## Runs that did not end ok" in text and "FileNotFoundError" in text
    assert "warm-up steps excluded" in text and "median" in text and "IQR" in text


def test_plots_are_written_from_files(rendered):
    _, dest, _ = rendered
    for name in report.PLOTS:
        data = (dest / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000, name
    assert (dest / "report.md").read_text().count("](") >= len(report.PLOTS)


def test_report_cli_errors_without_results(tmp_path, capsys):
    assert report.main(["--name", "missing", "--reports", str(tmp_path)]) == 2
    assert "bench.results.collect" in capsys.readouterr().err


def test_model_only_ratio_pairs_with_adamw_of_the_same_call():
    """Several measurement batches of one setup: each Muon run is compared with the AdamW run of its own commit (batch),
    nearest in start time, not with the last AdamW of the file."""
    setup = {c: "x" for c in report.GROUP_COLUMNS}

    def run(run_id, opt, sha, start, tf):
        return setup | {
            "run_id": run_id,
            "optimizer": opt,
            "status": "ok",
            "git_sha": sha,
            "start_time": start,
            "model_tflops_per_gpu": tf,
            "total_tflops_per_gpu": tf,
            "step_s_median": 100.0 / tf,
            "step_s_iqr": 0.0,
            "num_same_optimizer": 2,
        }

    rows = [
        run("a_adamw", "adamw", "aaa", "2026-11-29T10:00:00+00:00", 300.0),
        run("a_muon", "muon", "aaa", "2026-11-29T10:02:00+00:00", 297.0),
        run("b_adamw", "adamw", "bbb", "2026-11-29T11:00:00+00:00", 290.0),
        run("b_muon", "muon", "bbb", "2026-11-29T11:02:00+00:00", 287.1),
        run("b_adamw2", "adamw", "bbb", "2026-11-29T11:30:00+00:00", 295.0),
        run("c_muon", "muon", "ccc", "2026-11-29T12:00:00+00:00", 290.0),
    ]
    got = {
        x["optimizer"]: (x["baseline"], round(x["model_only_ratio"], 3))
        for x in report.model_only_ratios(rows)
    }
    assert got["muon (a_muon)"] == ("adamw (a_adamw)", 0.99)
    assert got["muon (b_muon)"] == ("adamw (b_adamw)", 0.99)  # nearest of its call's two AdamW runs
    assert got["muon (c_muon)"][0] == "adamw (b_adamw2)"  # no AdamW in its call: nearest start overall
    same = {x["optimizer"]: x["same_call"] for x in report.model_only_ratios(rows)}
    assert same == {"muon (a_muon)": True, "muon (b_muon)": True, "muon (c_muon)": False}  # c's is flagged


def test_pooled_ratio_per_call_averages_repeated_runs():
    """B A B A in one call: one pooled number (mean of the Muon configuration's runs over the mean of the AdamW
    runs); a call with a single pair gives none (the pair ratio says it); another configuration is its own line;
    runs from a dirty tree (a commit that names no call) are not pooled."""
    setup = {c: "x" for c in report.GROUP_COLUMNS}

    def run(run_id, opt, sha, tf, cfg="c1", dirty=""):
        return setup | {
            "run_id": run_id,
            "optimizer": opt,
            "status": "ok",
            "git_sha": sha,
            "git_dirty": dirty,
            "model_tflops_per_gpu": tf,
            "config_hash": cfg,
        }

    rows = [
        run("n_muon", "muon", "nnn", 292.0),
        run("n_adamw", "adamw", "nnn", 296.0),
        run("n_muon2", "muon", "nnn", 292.4),
        run("n_adamw2", "adamw", "nnn", 294.0),
        run("n_builtin", "muon", "nnn", 280.0, cfg="c2"),
        run("p_muon", "muon", "ppp", 290.0),
        run("p_adamw", "adamw", "ppp", 300.0),
        run("d_muon", "muon", "ddd", 290.0, dirty="True"),
        run("d_adamw", "adamw", "ddd", 300.0, dirty="True"),
        run("d_adamw2", "adamw", "ddd", 300.0, dirty="True"),
    ]
    got = {x["optimizer"]: round(x["model_only_ratio"], 4) for x in report.pooled_call_ratios(rows)}
    assert got == {
        "muon (n_muon, n_muon2)": round(292.2 / 295.0, 4),
        "muon (n_builtin)": round(280.0 / 295.0, 4),
    }


def test_pooled_across_calls_gives_mean_and_standard_error():
    """A configuration run in two calls: each run's ratio against its own call's AdamW mean, then mean / sd / s.e.;
    a configuration seen in one call only, or a call without AdamW, is not pooled; dirty trees are left out."""
    setup = {c: "x" for c in report.GROUP_COLUMNS}

    def run(run_id, opt, sha, tf, cfg="c1", dirty=""):
        return setup | {
            "run_id": run_id,
            "optimizer": opt,
            "status": "ok",
            "git_sha": sha,
            "git_dirty": dirty,
            "model_tflops_per_gpu": tf,
            "config_hash": cfg if opt != "adamw" else "ca",
        }

    rows = [
        run("m_muon", "muon", "mmm", 297.0),
        run("m_adamw", "adamw", "mmm", 300.0),
        run("m_adamw2", "adamw", "mmm", 300.0),
        run("n_muon", "muon", "nnn", 198.0),
        run("n_muon2", "muon", "nnn", 196.0),
        run("n_adamw", "adamw", "nnn", 200.0),
        run("n_other", "muon", "nnn", 150.0, cfg="c2"),  # one call only
        run("q_muon", "muon", "qqq", 100.0),  # no AdamW in batch q
        run("d_muon", "muon", "ddd", 10.0, dirty="True"),
        run("d_adamw", "adamw", "ddd", 300.0, dirty="True"),
    ]
    (got,) = report.pooled_across_calls(rows)
    ratios = [0.99, 0.99, 0.98]
    mean = sum(ratios) / 3
    sd = (sum((r - mean) ** 2 for r in ratios) / 2) ** 0.5
    assert got["runs"] == ["m_muon", "n_muon", "n_muon2"] and got["calls"] == ["mmm", "nnn"]
    assert got["mean"] == pytest.approx(mean) and got["sd"] == pytest.approx(sd)
    assert got["se"] == pytest.approx(sd / 3**0.5)
    assert "same_gpu_mean" not in got  # no call ran AdamW on two GPUs


def test_pooled_across_calls_matches_gpus_in_a_crossover():
    """Two crossover calls on two GPUs (GPU "1" runs 1% faster): against the call's AdamW mean the ratios carry the GPU
    difference; against the AdamW runs of the same call on the same GPU they do not. Runs on a GPU without AdamW runs
    in their call are left out of the GPU-matched numbers (none left: none given)."""
    setup = {c: "x" for c in report.GROUP_COLUMNS}

    def run(run_id, opt, sha, tf, gpu, cfg="c1"):
        return setup | {
            "run_id": run_id,
            "optimizer": opt,
            "status": "ok",
            "git_sha": sha,
            "git_dirty": "",
            "model_tflops_per_gpu": tf,
            "config_hash": cfg if opt != "adamw" else "ca",
            "visible_gpus": gpu,
        }

    rows = []
    for sha in ("ttt", "uuu"):
        rows += [
            run(f"{sha}_adamw0", "adamw", sha, 300.0, 0.0),  # read back from the CSV as a number
            run(f"{sha}_adamw1", "adamw", sha, 303.0, "1"),
            run(f"{sha}_muon0", "muon", sha, 297.0, "0"),
            run(f"{sha}_muon1", "muon", sha, 299.97, "1"),
            run(f"{sha}_lone", "muon", sha, 290.0, "2", cfg="c2"),  # no AdamW on GPU 2
            run(f"{sha}_c1_gpu2", "muon", sha, 250.0, "2"),  # c1 on GPU 2: in the call mean, not GPU-matched
        ]
    got = {x["config_hash"]: x for x in report.pooled_across_calls(rows)}
    c1 = got["c1"]
    assert c1["mean"] == pytest.approx((297.0 + 299.97 + 250.0) / 3 / 301.5)
    assert c1["sd"] > 0.004  # the GPU difference shows as spread
    assert c1["same_gpu_runs"] == 4 and c1["same_gpu_mean"] == pytest.approx(0.99)
    assert c1["same_gpu_sd"] == pytest.approx(0.0, abs=1e-12)
    assert "same_gpu_mean" not in got["c2"]


def test_labels_leave_out_how_a_run_was_started():
    """After a resume every label carried `bench.resume=<path>` (a value that differs between the runs)."""
    rows = [
        {"run_id": "0_adamw", "optimizer": "adamw", "overrides": "optimizer=adamw bench.steps=3"},
        {"run_id": "1_muon", "optimizer": "muon", "overrides": "optimizer=muon bench.steps=3 bench.resume=runs/a"},
        {"run_id": "2_muon", "optimizer": "muon", "overrides": "optimizer=muon bench.steps=5 +hydra.x=1"},
    ]
    assert report.run_labels(rows) == ["adamw bench.steps=3", "muon bench.steps=3", "muon bench.steps=5"]


def test_breakdown_other_is_each_steps_remainder_never_a_difference_of_medians():
    """Localises "other" = median(optimizer step) - median(NS) - median(AdamW part) - ..., which went negative
    (-4.11 ms) where the parts' medians add up to more than their whole's, and bars scaled down to fit the step:
    "other" is the median of each step's own remainder (here 1 ms in every step, where the old difference is
    -8 ms), and every bar is its part as measured."""
    from bench.results import plots

    whole = [0.010, 0.010, 0.010, 0.030, 0.030]
    steps = pd.DataFrame({
        "run_id": "r", "warmup": False, "optim_s": whole, "ns_s": [0.009, 0.009, 0.0, 0.020, 0.020],
        "adamw_s": [0.0, 0.0, 0.009, 0.009, 0.009], "clip_s": 0.0, "fwd_bwd_s": 0.005, "comm_s": 0.0,
        "step_s": [w + 0.006 for w in whole],
    })  # fmt: skip
    rows = [{"run_id": "r", "status": "ok", "optimizer": "muon", "step_s_median": 0.016, "fwd_bwd_s_median": 0.005,
             "comm_s_median": 0.0, "optim_s_median": 0.010, "ns_s_median": 0.009, "adamw_s_median": 0.009,
             "clip_s_median": 0.0}]  # fmt: skip
    report.add_remainders(rows, steps)
    assert rows[0]["other_optim_s_median"] == pytest.approx(0.001)
    assert rows[0]["rest_s_median"] == pytest.approx(0.001)
    table_row = next(ln for ln in unpad(report.breakdown(rows)).splitlines() if ln.startswith("| muon"))
    assert table_row.split(" | ")[8] == "1.00" and "-" not in table_row
    heights = [b.get_height() for b in plots.breakdown_figure(rows, lambda r: r["run_id"]).axes[0].patches]
    assert heights == pytest.approx([5.0, 0.0, 9.0, 9.0, 0.0, 1.0, 1.0])


def test_a_dry_run_and_an_all_failed_sweep_say_what_happened(tmp_path, capsys):
    """A dry-run record printed "nan: nan" as its error; an all-failed sweep printed tables of headers only."""
    from bench.results import record

    dirs = make_fixture_runs(tmp_path / "runs")
    for d in dirs[:2]:  # two scripts written by a dry run, the third run failed
        record.update_run_json(d, status="written", error=None, summary=None)
    dest = tmp_path / "report"
    collect.collect(dirs, dest)
    assert report.main(["--dir", str(dest)]) == 0
    out = unpad(capsys.readouterr().out)
    assert "nan" not in out and "| 0_adamw | adamw | written | script written, not submitted (launcher.dry_run) |" in out
    assert re.search(r"\| 2_muon \| [^|]+ \| error \| FileNotFoundError: ", out)
    text = (dest / "report.md").read_text()
    assert text.count(report.NONE_OK) == 2  # breakdown and loss: no table of headers alone
    assert "|---|---|---|---|---|---|---|---|---|---|---|\n\n" not in text


def test_suspect_records_are_flagged_and_give_no_ratio(rendered):
    """Localises a negative "other" optimizer time, a -inf ratio from a negative/infinite record and 100k step
    records against bench.steps=3 passing unflagged."""
    _, dest, _ = rendered
    results, steps = pd.read_csv(dest / "results.csv"), pd.read_csv(dest / "steps.csv")
    assert report.suspect_records(results.to_dict("records"), steps) == []  # the fixture's runs are sound
    bad = results.copy()
    muon = bad["run_id"] == "1_muon"
    bad.loc[muon, "model_tflops_per_gpu"] = float("-inf")
    bad.loc[muon, "ns_s_median"] = 1.0  # longer than the whole optimizer step
    bad.loc[bad["run_id"] == "0_adamw", "steps"] = 100_000
    flagged = report.suspect_records(bad.to_dict("records"), steps)
    assert len(flagged) == 2 and flagged[0].startswith("0_adamw: ") and "for bench.steps=100000" in flagged[0]
    assert "model_tflops_per_gpu=-inf" in flagged[1] and "negative other" in flagged[1]
    text = report.render(bad, steps, dest / "bad", "bad")
    assert "## Suspect records" in text and "model-only ratio n/a" in text


def test_an_interrupted_report_leaves_the_old_one_whole(rendered, tmp_path, monkeypatch):
    """Localises Ctrl-C during the plots leaving new plots beside the old report.md."""
    import shutil

    _, dest, _ = rendered
    copy = tmp_path / "r"
    shutil.copytree(dest, copy)
    before = {p.name: p.read_bytes() for p in copy.iterdir() if p.is_file()}

    def interrupt(fig, path):
        raise KeyboardInterrupt

    monkeypatch.setattr(report.plots, "save", interrupt)
    with pytest.raises(KeyboardInterrupt):
        report.render(pd.read_csv(copy / "results.csv"), pd.read_csv(copy / "steps.csv"), copy, "r")
    assert {p.name: p.read_bytes() for p in copy.iterdir() if p.is_file()} == before
    assert not list(copy.glob(".report.*"))  # the temporary folder is gone too


def test_markdown_tables_are_pandas():
    """Four report writers joined '|' cells by hand; every table is `markdown.table` (pandas `to_markdown`)."""
    from pathlib import Path

    from bench.results import markdown

    assert markdown.table(["a", "b"], [["1.50", "x"]]).splitlines() == ["| a    | b   |", "|:-----|:----|",
                                                                        "| 1.50 | x   |"]  # fmt: skip
    root = Path(report.__file__).parents[1]
    hand = [p for p in root.rglob("*.py") if '" | ".join(' in p.read_text() or "\"|---|\"" in p.read_text()]
    assert hand == []
