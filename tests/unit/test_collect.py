"""bench.results.collect: one tidy row per run (failed runs included), steps.csv, the LATEST.json default."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from test_record_fixtures import STEPS, make_fixture_runs

from bench.results import collect, record


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return root, make_fixture_runs(root)


def test_collect_one_row_per_run_including_failed(runs, tmp_path):
    """Localises a collector that drops failed runs (a sweep silently shrinking) or mixes up columns."""
    _root, dirs = runs
    results, steps = collect.collect(dirs, tmp_path)
    assert list(results["run_id"]) == ["0_adamw", "1_muon", "2_muon"]
    assert list(results["status"]) == ["ok", "ok", "error"]
    failed = results.set_index("run_id").loc["2_muon"]
    assert failed["error_type"] == "FileNotFoundError" and pd.isna(failed["step_s_median"])
    ok = results.set_index("run_id")
    assert ok.loc["1_muon", "optimizer"] == "muon" and ok.loc["1_muon", "optimizer.num_ns_steps"] == 5
    assert ok.loc["0_adamw", "world_size"] == 2 and ok.loc["0_adamw", "dp"] == 2
    assert ok.loc["1_muon", "step_s_median"] > ok.loc["0_adamw", "step_s_median"]
    assert len(ok.loc["0_adamw", "git_sha"]) == 40
    assert len(steps) == 2 * STEPS and set(steps["optimizer"]) == {"adamw", "muon"}
    on_disk = pd.read_csv(tmp_path / "results.csv")
    assert on_disk.shape == results.shape


def test_collect_writes_the_reports_provenance(runs, tmp_path):
    """run.json names every run with its status, commit, host and versions, and what collected the report."""
    _root, dirs = runs
    collect.collect(dirs, tmp_path, command=["python", "-m", "bench.results.collect", "--name", "x"])
    prov = record.read_json(tmp_path / "run.json")
    assert prov["schema"] == collect.REPORT_SCHEMA
    assert prov["collected_by"] == "python -m bench.results.collect --name x"
    assert [r["run_id"] for r in prov["runs"]] == ["0_adamw", "1_muon", "2_muon"]
    assert [r["status"] for r in prov["runs"]] == ["ok", "ok", "error"]
    shas = {r["git"]["sha"] for r in prov["runs"]}
    assert prov["commits"] == sorted(shas) and all(len(s) == 40 for s in shas)
    assert prov["versions"]["python"] and "torch" in prov["versions"]  # one version set: stated once
    assert len(prov["hosts"]) == 1 and "no GPU" in prov["hosts"][0]
    assert all(r["command"] for r in prov["runs"]) and prov["skipped_records"] == []


def test_provenance_lists_each_version_set_and_skipped_records(runs, tmp_path):
    """Runs with different versions keep each set; a broken record is named in run.json."""
    _root, dirs = runs
    recs = [record.read_json(d / "run.json") for d in dirs[:2]]
    recs[1] = {**recs[1], "versions": {**recs[1]["versions"], "torch": "0.0-other"}}
    prov = collect.provenance(recs, command=["c"], skipped=["x/run.json: missing; run skipped"])
    assert isinstance(prov["versions"], list) and len(prov["versions"]) == 2
    assert prov["skipped_records"] == ["x/run.json: missing; run skipped"]


def test_collect_cli_uses_latest_manifest(runs, tmp_path, capsys):
    root, dirs = runs
    record.write_json_atomic(
        root / "LATEST.json", {"report_name": "fixture", "runs": [str(d) for d in dirs[:2]]}
    )
    assert collect.main(["--out-dir", str(root), "--reports", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "0_adamw" in out and "2_muon" not in out
    assert len(pd.read_csv(tmp_path / "fixture" / "results.csv")) == 2


def test_collect_cli_glob_and_missing_manifest(runs, tmp_path, capsys):
    root, _ = runs
    assert collect.main(["--runs", str(root), "--reports", str(tmp_path)]) == 0
    assert len(pd.read_csv(tmp_path / "cpu_qwen3_moe_tiny_dp2" / "results.csv")) == 3
    assert collect.main(["--out-dir", str(tmp_path / "nothing")]) == 2
    assert "LATEST.json does not exist" in capsys.readouterr().err


def _copy_runs(dirs, dest):
    import shutil

    return [Path(shutil.copytree(d, dest / d.name)) for d in dirs]


def test_broken_records_are_skipped_alone_and_named(runs, tmp_path, capsys):
    """Localises a truncated run.json aborting the collect, a deleted one dropping its run silently, and one bad
    steps.jsonl line dropping every later step."""
    _, dirs = runs
    a, b, c = _copy_runs(dirs, tmp_path / "runs")
    text = (a / "run.json").read_text()
    (a / "run.json").write_text(text[: len(text) // 2])  # truncated
    (c / "run.json").unlink()  # deleted
    lines = (b / "steps.jsonl").read_text().splitlines()
    lines[2] = lines[2][:10]
    (b / "steps.jsonl").write_text("\n".join(lines) + "\n")
    record.write_json_atomic(
        tmp_path / "runs" / "LATEST.json",
        {"state": "complete", "report_name": "x", "runs": [str(d) for d in (a, b, c)], "sweep_dir": None},
    )
    reports = tmp_path / "reports"
    assert collect.main(["--out-dir", str(tmp_path / "runs"), "--reports", str(reports)]) == 0
    err = capsys.readouterr().err
    assert f"warning: {a / 'run.json'}:" in err and "unreadable JSON" in err
    assert f"warning: {c / 'run.json'}: missing; run skipped" in err
    assert f"warning: {b / 'steps.jsonl'}:3: skipped" in err
    results = pd.read_csv(reports / "x" / "results.csv")
    steps = pd.read_csv(reports / "x" / "steps.csv")
    assert list(results["run_id"]) == ["1_muon"]
    assert list(steps["step"]) == [s for s in range(STEPS) if s != 2]  # only the bad line is gone
    assert (
        collect.main(["--out-dir", str(tmp_path / "runs"), "--reports", str(tmp_path / "r2"), "--strict"])
        == 1
    )
    assert "unreadable JSON" in capsys.readouterr().err and not (tmp_path / "r2").exists()


def test_default_destination_is_the_sweeps_report_folder(runs, tmp_path, capsys):
    """Localises `make bench` writing into the committed reports/ tree: by default the report goes next to the runs."""
    _, dirs = runs
    sweep = tmp_path / "runs" / "20260101_000000_tiny"
    copied = _copy_runs(dirs[:2], sweep)
    record.write_json_atomic(
        tmp_path / "runs" / "LATEST.json",
        {"state": "running", "report_name": "x", "sweep_dir": str(sweep), "runs": [str(d) for d in copied]},
    )
    assert collect.main(["--out-dir", str(tmp_path / "runs")]) == 0
    assert (sweep / "report" / "results.csv").exists()
    assert "its invocation is running (2 runs recorded so far)" in capsys.readouterr().err
    assert collect.main(["--out-dir", str(tmp_path / "runs"), "--strict"]) == 1


def test_engine_layer_and_fusion_options_are_columns():
    """Runs of one experiment that differ only in the megatron engine's layers, fusion, router-dtype or
    main-grad-buffer options stay apart in results.csv (the Bridge-vs-engine ablation)."""
    from bench.results.collect import run_row

    engine = {
        "name": "megatron",
        "layers": "te",
        "moe_permute_fusion": True,
        "apply_rope_fusion": False,
        "moe_router_fusion": True,
        "moe_router_dtype": "none",
        "grad_reduce_in_fp32": False,
    }
    row = run_row({"run_id": "r", "status": "ok", "config": {"engine": engine}})
    assert {k: row[k] for k in engine if k != "name"} == {k: v for k, v in engine.items() if k != "name"}
    assert row["engine"] == "megatron"


def test_an_earlier_report_is_not_a_run_and_the_report_lists_what_was_left_out(runs, tmp_path, capsys):
    """`collect --runs <root>` counted earlier report/ folders as runs (empty rows); a truncated run.json or an
    ok run without steps.jsonl shrank the report with at most a stderr line. Now the report's own text lists
    every record left out and why."""
    from bench.results import report

    _, dirs = runs
    root = tmp_path / "runs"
    a, b, c = _copy_runs(dirs, root)
    collect.collect([a, b, c], root / "report")  # an earlier report inside the root
    assert collect.main(["--runs", str(root), "--reports", str(tmp_path / "r1"), "--name", "one"]) == 0
    assert len(pd.read_csv(tmp_path / "r1" / "one" / "results.csv")) == 3
    text = (b / "run.json").read_text()
    (b / "run.json").write_text(text[: len(text) // 3])  # truncated
    (a / "steps.jsonl").unlink()  # an ok run without its steps
    (c / "run.json").write_text("")  # empty
    assert collect.main(["--runs", str(root), "--reports", str(tmp_path / "r2"), "--name", "two"]) == 0
    capsys.readouterr()
    dest = tmp_path / "r2" / "two"
    assert list(pd.read_csv(dest / "results.csv")["run_id"]) == ["0_adamw"]
    md = report.render(pd.read_csv(dest / "results.csv"), pd.read_csv(dest / "steps.csv"), dest, "two")
    section = md.split("## Records left out", 1)[1].split("\n## ", 1)[0]
    assert f"- {a / 'steps.jsonl'}: missing for a run recorded ok; its row kept, no step rows" in section
    for broken in (b, c):
        assert f"- {broken / 'run.json'}:" in section
    assert section.count("unreadable JSON") == 2 and section.count("run skipped") == 2


def test_wrong_types_a_directory_and_a_fifo_are_skipped_alone_and_named(runs, tmp_path, capsys):
    """Localises one run.json with a wrong type aborting the whole collect naming no file, a run.json that is a
    directory failing with a traceback, and a steps.jsonl that is a FIFO blocking the collect forever."""
    import json
    import os

    _, dirs = runs
    a, b, c = _copy_runs(dirs, tmp_path / "runs")
    rec = json.loads((a / "run.json").read_text())
    (a / "run.json").write_text(json.dumps(rec | {"config": "not a mapping"}))
    (c / "run.json").unlink()
    (c / "run.json").mkdir()
    (b / "steps.jsonl").unlink()
    os.mkfifo(b / "steps.jsonl")
    problems: list[str] = []
    results, steps = collect.collect([a, b, c], tmp_path / "out", problems=problems)
    assert list(results["run_id"]) == ["1_muon"] and len(steps) == 0
    assert any(p.startswith(f"{a / 'run.json'}: a field has the wrong type") for p in problems)
    assert f"{c / 'run.json'}: not a regular file; run skipped" in problems
    assert f"{b / 'steps.jsonl'}: not a regular file; no step rows" in problems


def test_an_unwritable_report_folder_is_one_line(runs, tmp_path, capsys):
    """Localises `collect --reports <a file>/x` ending in a traceback."""
    from bench import entry

    _, dirs = runs
    blocker = tmp_path / "file"
    blocker.write_text("")
    argv = ["--runs", str(dirs[0]), "--reports", str(blocker / "x"), "--name", "n"]
    assert entry.run(lambda: collect.main(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(blocker) in err
