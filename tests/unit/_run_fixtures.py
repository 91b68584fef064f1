"""The run record of a tiny CPU run (the Qwen3-MoE proxy on the hf engine, one process), written as bench.run
writes it before launching, for the tests that run `bench.worker` in this process (test_worker_status,
test_worker_disk_full, test_run_judgement, test_sinks)."""

from __future__ import annotations

from pathlib import Path

import muonbench
from bench.results import record
from muonbench.schema import RootConfig

TINY_HF_RUN = (
    "model=qwen3_moe_tiny",
    "parallelism=single_gpu",
    "parallelism.gbs=2",
    "parallelism.mbs=2",
    "engine=hf",
    "hardware=cpu",
    "bench.warmup_steps=1",
    "bench.progress=false",
)


def write_tiny_run(run_dir: Path, *overrides: str, run_id: str = "tiny") -> RootConfig:
    """`run_dir/run.json` (status running) of the tiny run with `overrides` after `TINY_HF_RUN`; returns its
    config."""
    cfg = muonbench.load([*TINY_HF_RUN, *overrides])
    run_dir.mkdir(parents=True, exist_ok=True)
    record.write_json_atomic(
        run_dir / "run.json",
        record.new_run_record(
            run_id=run_id,
            run_dir=run_dir,
            config=muonbench.as_dict(cfg),
            config_hash=muonbench.config_hash(cfg),
            overrides=list(overrides),
            command=[],
        ),
    )
    return cfg
