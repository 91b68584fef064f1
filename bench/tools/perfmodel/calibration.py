"""The performance model's measured inputs: versioned data files with provenance, extracted from reports.

The model reads `bench/tools/perfmodel/data/*.json`, never a dated report folder; each file's `provenance` names
the report it was extracted from, the last commit that changed that report, the date and the command
(`bench.tools.perfmodel.extract` writes them). Every reader also takes a path argument pointing elsewhere (a data
file, or a folder of run records).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
NS_KERNELS = DATA / "ns_kernels_h200.json"
"""Per-shape NS milliseconds and whole-layer optimizer steps of the NS kernel benchmark on one H200."""
MEGATRON_RUNS = DATA / "megatron_h200_runs.json"
"""Single-H200 Megatron runs of two models and three optimizers; the H200 row's fitted value comes from one."""
FLOPS_RUNS = DATA / "megatron_h200_flops_runs.json"
"""The FLOP-matched Qwen3 slice runs on H200: out of sample (no constant is refitted on them)."""
BRIDGE_RUNS = DATA / "bridge_h200_runs.json"
"""Megatron-Bridge runs of one model on H200 (OLMoE-1B-7B slice, AdamW and Muon in crossover); the H200 row's
Bridge fraction is fitted on them."""

GPU_RUNS = DATA / "gpu_runs.json"
"""Every committed GPU run (the `runs/` folders of the reports, and the single-H200 Megatron report): what the
prediction intervals (`intervals`) and the memory fit (`memfit`) are computed from."""


def derived_provenance(source: Path, command: str) -> dict[str, str]:
    """Provenance of a data file computed from another (`source`): that file, its last commit, the date, the command."""
    from bench.tools.perfmodel.extract import provenance

    return {**provenance(source, []), "source": f"bench/tools/perfmodel/data/{source.name}", "command": command}


def load_runs(path: Path) -> list[dict[str, Any]]:
    """Run records as the model reads them ({run, status, config, summary, experts}), from a data file written
    by `extract.extract_runs` or from a folder of run records (`**/run.json`); [] when `path` does not exist."""
    if path.is_file():
        data = json.loads(path.read_text())
        return [
            {**r, "status": "ok", "config": data["configs"][r["config_hash"]]} for r in data.get("runs", [])
        ]
    out = []
    for rec_path in sorted(path.glob("**/run.json")) if path.is_dir() else []:
        rec = json.loads(rec_path.read_text())
        rec["run"] = f"{rec_path.parent.parent.name}/{rec_path.parent.name}"
        rec["experts"] = str(((rec.get("worker") or {}).get("engine") or {}).get("experts", ""))
        out.append(rec)
    return out
