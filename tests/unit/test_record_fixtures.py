"""Fixture runs for the record / collect / report tests: real configs, synthetic step numbers, one failed run."""

from __future__ import annotations

from pathlib import Path

import muonbench
from bench.results import record

STEP_S = {"adamw": 0.100, "muon": 0.125}
"""Steady-window step time of each fixture run (seconds); the warm-up steps are 10x slower."""
NS_FLOPS = 2.0e8
STEPS, WARMUP = 8, 3


def make_run(
    root: Path,
    name: str,
    optimizer: str,
    *,
    fail: bool = False,
    diverge_at: int | None = None,
    overrides: tuple[str, ...] = (),
) -> Path:
    """A run directory as bench.run leaves it: run.json (closed) and, unless `fail`, steps.jsonl; with
    `diverge_at` the loss is NaN from that step on and the run stopped there (status diverged)."""
    cfg = muonbench.load(
        [
            "experiment=cpu/qwen3_moe_tiny_dp2",
            f"optimizer={optimizer}",
            f"bench.steps={STEPS}",
            f"bench.warmup_steps={WARMUP}",
            *overrides,
        ]
    )
    run_dir = root / name
    rec = record.new_run_record(
        run_id=name,
        run_dir=run_dir,
        config=muonbench.as_dict(cfg),
        config_hash=muonbench.config_hash(cfg),
        overrides=[f"optimizer={optimizer}", *overrides],
        command=["python", "-m", "bench.run", f"optimizer={optimizer}"],
    )
    record.write_json_atomic(run_dir / "run.json", rec)
    if fail:
        err = {
            "type": "FileNotFoundError",
            "message": "[Errno 2] No such file: '/nope'",
            "traceback": "Traceback...",
            "returncode": 1,
            "stderr_tail": "bench.worker FAILED\n",
        }
        record.finalize(run_dir, status="error", error=err)
        return run_dir
    log = record.StepLog(run_dir)
    base = STEP_S.get(optimizer, STEP_S["muon"])
    for i in range(STEPS if diverge_at is None else diverge_at + 1):
        warm = i < WARMUP
        step_s = base * (10 if warm else 1) + (0.001 * (i % 3) if not warm else 0.0)
        ns = 0.020 if optimizer.startswith("muon") else None
        log.write(
            {
                "step": i,
                "warmup": warm,
                "step_s": step_s,
                "fwd_bwd_s": 0.070,
                "comm_s": 0.010,
                "optim_s": 0.015 + (ns or 0.0),
                "ns_s": ns,
                "adamw_s": 0.002,
                "tokens": 512,
                "loss": float("nan") if i == diverge_at else 6.3 - 0.01 * i,
                "peak_mem_bytes": 800 * 2**20 + i,
                "ns_flops": NS_FLOPS if optimizer.startswith("muon") else 0.0,
                "cpu_s": step_s,
            }
        )
    log.close()
    record.update_run_json(run_dir, worker={"timer": "perf_counter"})
    if diverge_at is None:
        record.finalize(run_dir, status="ok")
    else:
        record.finalize(run_dir, status="diverged", divergence={"step": diverge_at, "loss": "nan"})
    return run_dir


def make_fixture_runs(root: Path) -> list[Path]:
    """AdamW ok, Muon ok, Muon failed (no steps)."""
    return [
        make_run(root, "0_adamw", "adamw"),
        make_run(root, "1_muon", "muon"),
        make_run(root, "2_muon", "muon", fail=True),
    ]
