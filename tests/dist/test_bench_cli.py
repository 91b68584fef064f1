"""The product's main path end to end: `python -m bench.run -m ...` with 2 gloo ranks under torchrun, then
`bench.collect` and `bench.report`, on the tiny Qwen3-MoE proxy (3 steps per run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

COMMON = [
    "experiment=cpu/qwen3_moe_tiny_dp2",
    "bench.steps=3",
    "bench.warmup_steps=1",
    "bench.progress=false",
]


def _cli(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_sweep_runs_records_and_reports(tmp_path):
    """A 2-rank AdamW/Muon sweep with one impossible-layout job: the sweep goes on, every job leaves a record."""
    out = tmp_path / "runs"
    res = _cli(
        "bench.run",
        "-m",
        "optimizer=adamw,muon",
        "parallelism.gbs=8,6",
        *COMMON,
        f"bench.out_dir={out}",
        cwd=tmp_path,
    )
    assert res.returncode == 1, res.stdout + res.stderr  # the two gbs=6 jobs break a layout rule
    assert "global batch must be divisible by MBS x DP" in res.stderr
    recs = {p.parent.name: json.loads(p.read_text()) for p in out.rglob("run.json")}
    assert sorted(recs) == ["0_adamw", "1_adamw", "2_muon", "3_muon"]  # gbs varies fastest
    ok = {name: r for name, r in recs.items() if r["status"] == "ok"}
    assert sorted(ok) == ["0_adamw", "2_muon"]
    assert {recs[n]["error"]["type"] for n in ("1_adamw", "3_muon")} == {"ConfigError"}
    assert all(recs[n]["launch_command"] is None for n in ("1_adamw", "3_muon"))  # failed before launch
    for rec in ok.values():
        steps = [json.loads(x) for x in (out / rec["run_id"] / "steps.jsonl").read_text().splitlines()]
        assert [s["warmup"] for s in steps] == [True, False, False]
        assert all(s["tokens"] == 8 * 64 and s["step_s"] > 0 and s["comm_s"] > 0 for s in steps)
        assert "--nproc_per_node=2" in rec["launch_command"]
        assert rec["worker"]["timer"] == "perf_counter" and rec["summary"]["model_tflops_per_gpu"] > 0
    muon = ok["2_muon"]["summary"]
    assert (
        muon["ns_s_median"] > 0
        and 0 < muon["ns_flops_per_gpu_per_step"] <= muon["ns_flops_enumerated_per_step"]
    )
    assert ok["0_adamw"]["summary"]["ns_s_median"] is None
    assert "layerwise" in ok["2_muon"]["worker"]["engine"]["optimizer_distribution"]

    reports = tmp_path / "reports"
    col = _cli("bench.collect", "--out-dir", str(out), "--reports", str(reports), cwd=tmp_path)
    assert col.returncode == 0, col.stderr
    rep = _cli("bench.report", "--reports", str(reports), cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    assert "model-only ratio" in rep.stdout and "total = model + NS" in rep.stdout
    dest = reports / "cpu_qwen3_moe_tiny_dp2"
    assert (dest / "report.md").exists() and (dest / "loss.png").stat().st_size > 5000
    assert "ConfigError" in (dest / "report.md").read_text()


def test_failing_rank_leaves_an_error_record(tmp_path):
    """A worker exception (missing data file) under torchrun: status error with the exception and stderr tail.

    One rank keeps it cheap; the 2-rank path is covered above."""
    out = tmp_path / "runs"
    res = _cli(
        "bench.run",
        "optimizer=adamw",
        "bench.data=text:/nonexistent/corpus.txt",
        *COMMON,
        "parallelism.world_size=1",
        "parallelism.gpus_per_node=1",
        "parallelism.gbs=2",
        f"bench.out_dir={out}",
        cwd=tmp_path,
    )
    assert res.returncode == 1
    (path,) = out.rglob("run.json")
    rec = json.loads(path.read_text())
    assert rec["status"] == "error" and rec["error"]["type"] == "FileNotFoundError"
    assert rec["error"]["stderr_tail"] and rec["error"]["returncode"] != 0 and rec["end_time"]
