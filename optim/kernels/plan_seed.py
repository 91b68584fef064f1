"""Shipped NS plan entries: a cold cache adopts a choice measured elsewhere instead of timing every candidate.

Timing every candidate of every shape costs tens of seconds in the first optimizer step of every process
(docs/bridge_h200.md, "First step"). A seed file under `plan_seeds/` holds plan-cache entries measured on one GPU
model with its provenance; `Planner.choose` adopts an entry only when its key matches the process's plan key
exactly (GPU name, torch, Triton, QuACK and plan version, shape, dtype, coefficients), and only after the chosen
candidate ran once and agreed with cuBLAS.

A shape with no entry of its own is still measured, but only on a prior (`prior`): the PRIOR_SIZE candidates that
came closest to the fastest over the shipped entries of the same environment and problem class (input dtype,
Gram-NS, iterate dtype, whether CUDA-graph variants are offered), plus the cuBLAS bodies. Where no entry of the same
GPU name shares the class, the entries of GPUs of the same compute capability rank it (an H100 on H200 seeds: both
SM 9.0; a seed file's `provenance.compute_capability`). The entry records the candidates it timed (`prior`), and a
later process takes it as complete.

`MUONBENCH_NS_PLAN=measure` turns both off: every candidate of every shape is timed, and entries measured on a
prior are measured again in full.
"""

from __future__ import annotations

import functools
import json
import os
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import cast

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


# How many of the best-ranked candidates a shape without an entry of its own times besides cuBLAS; how close its pick
# comes to the full search on the shipped entries: docs/ns_kernels_h200.md#plan-prior.
PRIOR_SIZE = 4
_SHAPE = re.compile(r"\d+x\d+x\d+")


def problem_class(key: str, graph: bool) -> str:
    """A plan key without its shape and coefficients, with whether graph variants are offered: the keys whose
    timings rank candidates for each other (same GPU and software, input dtype, Gram-NS, restarts, eps, iterate)."""
    parts = key.split("|")
    i = next(j for j, p in enumerate(parts) if _SHAPE.fullmatch(p))
    return "|".join([*parts[:i], parts[i + 1], *parts[i + 3 :], f"graph={graph}"])


def _offers_graphs(names: Iterable[str]) -> bool:
    return any(n.endswith("+graph") for n in names)


def prior(
    key: str, offered: Sequence[str], seed_dir: Path | None = None, capability: str | None = None
) -> list[str] | None:
    """The candidates of `offered` to time for a plan key that no seed entry matches (`prior_from` over the shipped
    entries, `capability` the process GPU's "major.minor"); None (time all of `offered`) when seeding is off or no
    shipped entry shares the problem class."""
    if mode() != "seed":
        return None
    return prior_from(seeds(seed_dir), key, offered, PRIOR_SIZE, capability)


def without_gpu(cls: str) -> str:
    """A `problem_class` without its GPU name: the class shared by GPUs of one compute capability."""
    return cls.split("|", 1)[1]


def capability_of(entry: Mapping[str, object]) -> str | None:
    """The compute capability ("9.0") of the GPU a seed entry was measured on, where its seed file names it."""
    source = cast(Mapping[str, object], entry.get("seed") or {})
    cap = source.get("compute_capability")
    return str(cap) if cap else None


def _relative(
    entries: Mapping[str, Mapping[str, object]],
    same: Callable[[str, Mapping[str, object], Mapping[str, float]], bool],
) -> dict[str, list[float]]:
    """Each candidate's times relative to the fastest of its entry, over the entries `same` accepts."""
    relative: dict[str, list[float]] = {}
    for k, entry in entries.items():
        times = cast(Mapping[str, float], entry.get("times_ms") or {})
        if not times or not same(k, entry, times):
            continue
        best = min(times.values())
        for name, ms in times.items():
            relative.setdefault(name, []).append(ms / best)
    return relative


def prior_from(
    entries: Mapping[str, Mapping[str, object]],
    key: str,
    offered: Sequence[str],
    size: int = PRIOR_SIZE,
    capability: str | None = None,
) -> list[str] | None:
    """The `size` candidates of `offered` with the lowest mean time relative to the fastest over the entries of the
    same `problem_class` as `key` (where none: over the entries of GPUs of compute `capability` in that class
    without the GPU name), and every cuBLAS body (`plain_torch`, its graph variant), in `offered`'s order; None when
    no entry shares the class."""
    cls = problem_class(key, _offers_graphs(offered))
    relative = _relative(entries, lambda k, e, times: problem_class(k, _offers_graphs(times)) == cls)
    if not relative and capability:
        relative = _relative(
            entries,
            lambda k, e, times: capability_of(e) == capability
            and without_gpu(problem_class(k, _offers_graphs(times))) == without_gpu(cls),
        )
    if not relative:
        return None
    ranked = sorted((n for n in offered if n in relative), key=lambda n: statistics.mean(relative[n]))
    keep = set(ranked[:size]) | {n for n in offered if n.split("+")[0] == "plain_torch"}
    return [n for n in offered if n in keep]


def leave_one_out(entries: Mapping[str, Mapping[str, object]], size: int = PRIOR_SIZE) -> dict[str, float]:
    """For each entry: how much slower the fastest candidate of its prior, ranked on the other entries, is than its
    fastest candidate (0.01 = 1%), both from its own timings; entries whose class has no other entry are left out."""
    out = {}
    for key, entry in entries.items():
        times = cast(Mapping[str, float], entry.get("times_ms") or {})
        others = {k: e for k, e in entries.items() if k != key}
        narrowed = prior_from(others, key, list(times), size) if times else None
        if narrowed:
            out[key] = min(times[n] for n in narrowed) / min(times.values()) - 1.0
    return out


_ABS_PREFIX = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)*?(?=(?:reports|conf|tests)/)")


def repo_relative(arg: str) -> str:
    """A command argument with the absolute prefix of a checkout cut before `reports/`, `conf/` or `tests/` (folders
    only a checkout has): a shipped file names no checkout's paths. Any other path (an output folder such as
    `/tmp/runs/x`, which need not lie in a checkout) is kept as given: cutting it would name a place the run never
    wrote."""
    return _ABS_PREFIX.sub("", arg)


SEED_FIELDS = ("method", "rejected", "times_ms")
"""What a seed entry keeps of a plan-cache entry: the choice and the timings it was made from."""


def from_run(run_dir: Path, report: str, capability: str | None = None) -> dict[str, object]:
    """A seed file's content from one run record (`run.json` with its `ns_plan`), made by a Muon run that measured
    its plan on a cold cache; `report` names the committed report that holds the run; `capability`: the GPU's
    compute capability ("9.0") where the record does not hold it (`worker.compute_capability`)."""
    rec = json.loads((Path(run_dir) / "run.json").read_text())
    capability = (rec.get("worker") or {}).get("compute_capability") or capability
    plan = rec.get("ns_plan") or {}
    if not plan:
        raise ValueError(f"{run_dir}/run.json has no ns_plan: only a Muon run that planned its NS kernels has one")
    gpu = (rec.get("hardware") or {}).get("gpu_name")
    # An entry timed on a prior lacks the other candidates' times: it would narrow the next priors to itself.
    entries = {
        key: {f: entry[f] for f in SEED_FIELDS if f in entry}
        for key, entry in sorted(plan.items())
        if not entry.get("fallback") and not entry.get("prior") and entry.get("method") in (entry.get("times_ms") or {})
    }
    if not entries:
        raise ValueError(
            f"{run_dir}/run.json: no NS plan entry timed every candidate (each fell back or was timed on a prior); "
            "run it again with MUONBENCH_NS_PLAN=measure"
        )
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
            "command": [repo_relative(str(a)) for a in rec.get("command") or []],
            "git": rec.get("git"),
            "gpu": gpu,
            "compute_capability": capability,
            "versions": rec.get("versions"),
        },
        "entries": entries,
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m optim.kernels.plan_seed RUN_DIR REPORT OUT [CAPABILITY]`: write a seed file from a run's measured NS
    plan (CAPABILITY, e.g. 9.0, where the run record predates `worker.compute_capability`).
    `python -m optim.kernels.plan_seed --check-prior`: the prior's leave-one-out regret on the shipped seeds."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args == ["--check-prior"]:
        shipped = seeds()
        for size in (1, 2, 3, PRIOR_SIZE, 6):
            regret = leave_one_out(shipped, size)
            if not regret:
                print(f"error: no problem class in {SEED_DIR} has two entries to rank on", file=sys.stderr)
                return 2
            worst = max(regret, key=regret.__getitem__)
            print(
                f"prior of {size}{' (PRIOR_SIZE)' if size == PRIOR_SIZE else ''}: {len(regret)} entries, regret "
                f"mean {statistics.mean(regret.values()):.2%}, max {regret[worst]:.2%} "
                f"({_SHAPE.search(worst).group(0)})"  # type: ignore[union-attr]
            )
        return 0
    if len(args) not in (3, 4):
        print(
            "usage: python -m optim.kernels.plan_seed RUN_DIR REPORT OUT.json [CAPABILITY] | --check-prior",
            file=sys.stderr,
        )
        return 2
    try:
        doc = from_run(Path(args[0]), args[1], args[3] if len(args) == 4 else None)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    entries = doc["entries"]
    Path(args[2]).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"{args[2]}: {len(entries) if isinstance(entries, dict) else 0} entries")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
