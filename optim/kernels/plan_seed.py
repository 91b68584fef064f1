"""Shipped NS plan entries: a cold cache adopts a choice measured elsewhere instead of timing every candidate.

Timing every candidate of every shape costs tens of seconds in the first optimizer step of every process
(docs/bridge_h200.md, "First step"). A seed file under `plan_seeds/` holds plan-cache entries measured on one GPU
model with its provenance; `Planner.choose` adopts an entry only when its key matches the process's plan key
exactly (GPU name, torch, Triton, QuACK and plan version, shape, dtype, coefficients), and only after the chosen
candidate ran once and agreed with cuBLAS. `MUONBENCH_NS_PLAN=measure` measures every candidate as before.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

SEED_DIR = Path(__file__).resolve().parent / "plan_seeds"
MODES = ("seed", "measure")


def mode() -> str:
    """`MUONBENCH_NS_PLAN`: `seed` (default: adopt a matching shipped entry) or `measure` (time every candidate)."""
    value = os.environ.get("MUONBENCH_NS_PLAN", "seed")
    if value not in MODES:
        raise ValueError(f"MUONBENCH_NS_PLAN={value!r}: must be one of {list(MODES)}")
    return value


def seeds(seed_dir: Path | None = None) -> dict[str, dict[str, object]]:
    """Every entry of the seed files in `seed_dir` (default SEED_DIR) by plan key; each entry carries `seed` (its
    file and the provenance of the run that measured it)."""
    return _read(seed_dir or SEED_DIR)


@functools.cache
def _read(seed_dir: Path) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for path in sorted(seed_dir.glob("*.json")):
        doc = json.loads(path.read_text())
        source = {"file": path.name, **doc.get("provenance", {})}
        for key, entry in doc["entries"].items():
            out[key] = {**entry, "seed": source}
    return out


def lookup(key: str, seed_dir: Path | None = None) -> dict[str, object] | None:
    """The shipped entry for this exact plan key, or None (also when seeding is turned off)."""
    if mode() != "seed":
        return None
    entry = seeds(seed_dir).get(key)
    return dict(entry) if entry is not None else None
