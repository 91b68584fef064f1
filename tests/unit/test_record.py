"""Run records: atomic writes, the steps.jsonl vocabulary, the summary protocol, failed runs."""

from __future__ import annotations

import json
import os
import statistics

import numpy as np
import pytest
from test_record_fixtures import NS_FLOPS, STEP_S, WARMUP, make_run

import muonbench
from bench import flops, metrics
from bench.results import record


def test_write_json_atomic_leaves_no_temp_and_is_readable(tmp_path):
    """Localises a non-atomic writer (temp files left behind, unreadable mode)."""
    path = tmp_path / "sub" / "run.json"
    record.write_json_atomic(path, {"a": 1})
    record.write_json_atomic(path, {"a": 2, "b": [1, 2]})
    assert record.read_json(path) == {"a": 2, "b": [1, 2]}
    assert [p.name for p in path.parent.iterdir()] == ["run.json"]
    assert os.stat(path).st_mode & 0o044 == 0o044


def test_steplog_rejects_keys_outside_vocabulary_and_reader_drops_torn_line(tmp_path):
    log = record.StepLog(tmp_path)
    log.write({"step": 0, "step_s": 1.0})
    with pytest.raises(AssertionError, match="vocabulary"):
        log.write({"step": 1, "gpu_util": 0.5})
    log.close()
    with open(tmp_path / "steps.jsonl", "a") as f:
        f.write('{"step": 1, "step_')
    with pytest.warns(record.RecordWarning, match=r"steps.jsonl:2: skipped"):
        rows = record.read_steps(tmp_path)
    assert len(rows) == 1 and set(rows[0]) == set(metrics.step_keys()) and rows[0]["loss"] is None


def test_bad_steps_line_skips_only_itself_and_is_named(tmp_path):
    """Localises one corrupted line of steps.jsonl dropping every later step."""
    lines = [json.dumps({"step": 0}), "{garbage", json.dumps({"step": 2}), "[1, 2]", json.dumps({"step": 4})]
    (tmp_path / "steps.jsonl").write_text("\n".join(lines) + "\n")
    problems: list[str] = []
    rows = record.read_steps(tmp_path, problems=problems)
    assert [r["step"] for r in rows] == [0, 2, 4]
    assert [p.split(": ")[0] for p in problems] == [f"{tmp_path / 'steps.jsonl'}:{n}" for n in (2, 4)]


def test_every_status_is_documented():
    """docs/run_status.md has a row for each Status value, and the README points to it."""
    root = muonbench.CONF_DIR.parent
    doc = (root / "docs" / "run_status.md").read_text()
    rows = {line.split("|")[1].strip().strip("`") for line in doc.splitlines() if line.startswith("| `")}
    assert rows == {s.value for s in record.Status}
    assert "docs/run_status.md" in (root / "README.md").read_text()


def test_summarize_excludes_warmup_and_uses_median_iqr():
    """Localises warm-up leaking into the statistic or a TFLOP/s formula that forgets the GPU count."""
    times = [9.0, 9.0, 1.0, 3.0, 2.0, 4.0]
    steps = [
        {"step": i, "warmup": i < 2, "step_s": t, "tokens": 100, "loss": 1.0, "ns_flops": 5e11}
        for i, t in enumerate(times)
    ]
    s = record.summarize(steps, world_size=2, model_flops_per_step=8e12, peak_tflops=10.0)
    assert s["num_steady_steps"] == 4
    assert s["step_s_median"] == 2.5
    assert s["step_s_p25"] == pytest.approx(1.75) and s["step_s_p75"] == pytest.approx(3.25)
    assert s["model_tflops_per_gpu"] == pytest.approx(8.0 / 2.5 / 2)
    assert s["ns_tflops_per_gpu"] == pytest.approx(0.5 / 2.5)
    assert s["total_tflops_per_gpu"] == pytest.approx(s["model_tflops_per_gpu"] + s["ns_tflops_per_gpu"])
    assert s["mfu"] == pytest.approx(1.6 / 10.0)
    assert s["tokens_per_s_per_gpu"] == pytest.approx(100 / 2.5 / 2)
    assert s["first_step_s"] == 9.0 and s["first_optim_s"] is None  # reported apart, never in the median
    assert record.summarize(steps[:2], world_size=2, model_flops_per_step=1.0) is None


def test_fixture_run_record_has_provenance_and_summary(tmp_path):
    run = make_run(tmp_path, "0_muon", "muon")
    rec = record.read_json(run / "run.json")
    assert rec["schema"] == record.RUN_SCHEMA and rec["status"] == "ok" and rec["error"] is None
    assert set(rec["versions"]) >= {
        "torch",
        "megatron-core",
        "megatron-bridge",
        "transformers",
        "emerging-optimizers",
    }
    assert rec["versions"]["torch"].startswith("2.")
    assert len(rec["git"]["sha"]) == 40 and isinstance(rec["git"]["dirty"], bool)
    assert rec["hardware"]["cpu_count"] >= 1
    assert rec["config"]["optimizer"]["name"] == "muon" and len(rec["config_hash"]) == 12
    s = rec["summary"]
    assert s["num_steady_steps"] == 8 - WARMUP
    assert s["step_s_median"] == pytest.approx(STEP_S["muon"] + 0.001)
    cfg = muonbench.load(["experiment=cpu/qwen3_moe_tiny_dp2", "optimizer=muon"])
    want = flops.model_flops_per_step(cfg.model, cfg.parallelism)
    assert s["model_flops_per_step"] == pytest.approx(want)
    assert s["model_tflops_per_gpu"] == pytest.approx(want / s["step_s_median"] / 2 / 1e12)
    assert s["ns_tflops_per_gpu"] == pytest.approx(NS_FLOPS / s["step_s_median"] / 1e12)
    assert s["ns_flops_enumerated_per_step"] > 0
    assert s["loss_last"] == pytest.approx(6.3 - 0.07)
    lines = (run / "steps.jsonl").read_text().splitlines()
    assert [json.loads(x)["warmup"] for x in lines] == [True] * WARMUP + [False] * (8 - WARMUP)


def test_failed_run_still_writes_complete_record(tmp_path):
    run = make_run(tmp_path, "9_muon", "muon", fail=True)
    rec = record.read_json(run / "run.json")
    assert rec["status"] == "error" and rec["summary"] is None
    assert rec["error"]["type"] == "FileNotFoundError" and "FAILED" in rec["error"]["stderr_tail"]
    assert rec["end_time"] and rec["duration_s"] >= 0 and rec["config"]["optimizer"]["name"] == "muon"


@pytest.mark.parametrize(
    ("kw", "want"),
    [
        ({"returncode": None, "timed_out": True, "worker_error": None}, "timeout"),
        ({"returncode": 1, "timed_out": False, "worker_error": {"type": "OutOfMemoryError"}}, "oom"),
        ({"returncode": -9, "timed_out": False, "worker_error": None}, "killed"),
        (
            {"returncode": 1, "timed_out": False, "worker_error": {"type": "RuntimeError"}, "killed_by": 9},
            "killed",
        ),
        ({"returncode": 1, "timed_out": False, "worker_error": {"type": "ValueError"}}, "error"),
    ],
)
def test_classify_failure(kw, want):
    assert record.classify_failure(**kw) == want


def test_config_round_trips_through_run_json():
    """The worker rebuilds its config from run.json; localises a schema field lost on the way."""
    cfg = muonbench.load(["experiment=cpu/qwen3_moe_tiny_dp2", "optimizer=muon", "optimizer.num_ns_steps=6"])
    d = json.loads(json.dumps(muonbench.as_dict(cfg)))
    back = muonbench.config_from_dict(d)
    assert back == cfg and muonbench.config_hash(back) == muonbench.config_hash(cfg)
    d["optimizer"]["name"] = "sgd"
    with pytest.raises(ValueError, match="optimizer.name='sgd'"):
        muonbench.config_from_dict(d)


def test_summary_quantiles_are_numpys():
    """The steady window's median and IQR are numpy's (linear interpolation), not a hand-written quantile."""
    times = [0.3, 0.1, 0.7, 0.2, 0.9]
    steps = [{"step": i, "warmup": False, "step_s": t, "tokens": 8} for i, t in enumerate(times)]
    got = record.summarize(steps, world_size=1, model_flops_per_step=None)
    assert not hasattr(record, "_quantile")
    assert (got["step_s_p25"], got["step_s_median"], got["step_s_p75"]) == tuple(np.quantile(times, [0.25, 0.5, 0.75]))
    assert got["step_s_median"] == statistics.median(times)


def test_git_info_env_override_for_copies_without_git(tmp_path, monkeypatch):
    """A tree copied without .git (device machine, container) records the SHA its copier set, marked as such."""
    monkeypatch.delenv("MUONBENCH_GIT_SHA", raising=False)
    assert record.git_info(tmp_path) == {"sha": None, "dirty": None}  # no git repo there
    monkeypatch.setenv("MUONBENCH_GIT_SHA", "abc1234")
    assert record.git_info(tmp_path) == {"sha": "abc1234", "dirty": None, "source": "env"}
    monkeypatch.setenv("MUONBENCH_GIT_DIRTY", "1")
    assert record.git_info(tmp_path)["dirty"] is True
    monkeypatch.setenv("MUONBENCH_GIT_DIRTY", "0")
    assert record.git_info(tmp_path)["dirty"] is False


def test_counts_say_one_run_not_one_runs():
    from bench.results.record import count

    assert (count(1, "run"), count(0, "run"), count(2, "run")) == ("1 run", "0 runs", "2 runs")
