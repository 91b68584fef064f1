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


SEED_FIELDS = ("method", "rejected", "times_ms")
"""What a seed entry keeps of a plan-cache entry: the choice and the timings it was made from."""


def from_run(run_dir: Path, report: str) -> dict[str, object]:
    """A seed file's content from one run record (`run.json` with its `ns_plan`), made by a Muon run that measured
    its plan on a cold cache; `report` names the committed report that holds the run."""
    rec = json.loads((Path(run_dir) / "run.json").read_text())
    plan = rec.get("ns_plan") or {}
    if not plan:
        raise ValueError(f"{run_dir}/run.json has no ns_plan: only a Muon run that planned its NS kernels has one")
    gpu = (rec.get("hardware") or {}).get("gpu_name")
    return {
        "about": (
            f"NS plan entries (optim.kernels.plan cache format) measured on one {gpu} by run {rec['run_id']} of "
            f"{report}. A process whose plan key matches an entry exactly adopts its choice after checking it "
            "against cuBLAS once (optim.kernels.plan_seed); MUONBENCH_NS_PLAN=measure turns this off."
        ),
        "provenance": {
            "report": report,
            "run_id": rec["run_id"],
            "start_time": rec.get("start_time"),
            "command": rec.get("command"),
            "git": rec.get("git"),
            "gpu": gpu,
            "versions": rec.get("versions"),
        },
        "entries": {
            key: {f: entry[f] for f in SEED_FIELDS if f in entry}
            for key, entry in sorted(plan.items())
            if not entry.get("fallback") and entry.get("method") in (entry.get("times_ms") or {})
        },
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m optim.kernels.plan_seed RUN_DIR REPORT OUT`: write a seed file from a run's measured NS plan."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m optim.kernels.plan_seed RUN_DIR REPORT OUT.json", file=sys.stderr)
        return 2
    try:
        doc = from_run(Path(args[0]), args[1])
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    entries = doc["entries"]
    Path(args[2]).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"{args[2]}: {len(entries) if isinstance(entries, dict) else 0} entries")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
