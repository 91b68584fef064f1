"""Does the NS plan's choice hold at the GPU's power cap?

The plan (`optim.kernels.plan`) times its candidates per call on an idle GPU (`optim.kernels.timing`). An optimizer
step of a large MoE layer runs NS back to back for tens of ms, and on an H200 it runs at the 700 W power cap, where
the clock drops until the power fits (`experiments/optim_step_profile`): a candidate's time there follows its
energy, not its idle-GPU speed. This script times every plain candidate of a shape both ways, interleaved:

- `idle_ms`: the plan's own protocol (latency of one call on an idle GPU, median of rounds);
- `capped_ms`: the mean per call of a block of back-to-back calls lasting about `block_ms` (the GPU at its cap
  after the first block), median over `rounds` blocks, the candidates rotated per round;

and samples power and SM clock with nvidia-smi during the capped blocks (and reads the joules per call from NVML
when nvidia-ml-py is present).

Usage: `python -m experiments.ns_plan_hot.hot_plan [shapes=128x1536x2048,128x768x2048] [block_ms=300] [rounds=5]
[candidates=a,b,...] [out=hot_plan.json]` (one CUDA GPU; QuACK's candidates when quack-kernels is installed).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from experiments.gpu_energy.gpu_energy import capped_blocks, energy_meter_or_none


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """ "B x m x n" triples separated by commas, m <= n (the NS orientation)."""
    out = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"shapes: {item!r} is not BxMxN with positive integers (e.g. 128x1536x2048)")
        b, m, n = (int(p) for p in parts)
        if m > n:
            raise ValueError(f"shapes: {item!r} has m > n; give the NS orientation (rows <= cols)")
        out.append((b, m, n))
    return out


def main(argv: list[str]) -> int:
    import torch

    from optim.functional.newton_schulz import ns_coefficients
    from optim.kernels import sym_quack
    from optim.kernels.plan import Planner, candidate_names
    from optim.kernels.timing import interleaved_medians, latency_ms

    args = dict(a.split("=", 1) for a in argv)
    allowed = {"shapes", "block_ms", "rounds", "candidates", "out"}
    if set(args) - allowed:
        raise ValueError(f"unknown arguments {sorted(set(args) - allowed)}; allowed: {sorted(allowed)}")
    if not torch.cuda.is_available():
        raise SystemExit("hot_plan needs a CUDA GPU")
    shapes = parse_shapes(args.get("shapes", "128x1536x2048,128x768x2048"))
    block_ms = float(args.get("block_ms", "300"))
    rounds = int(args.get("rounds", "5"))
    only = set(args["candidates"].split(",")) if "candidates" in args else None
    coeffs = ns_coefficients("quintic", 5)
    dev = torch.device("cuda")
    planner = Planner()
    quack = sym_quack.usable(dev)
    meter = energy_meter_or_none(dev.index or 0)
    res: dict[str, Any] = {"block_ms": block_ms, "rounds": rounds, "shapes": {}}
    for b, m, n in shapes:
        names = [
            c
            for c in candidate_names(
                b, m, n, len(coeffs), False, triton_ok=True, quack_ok=quack, quack_configs=quack
            )
            if not c.endswith("+graph") and (only is None or c in only)
        ]
        x = torch.randn(b, m, n, device=dev)
        key = f"hot_plan|{b}x{m}x{n}"
        fns = {}
        for c in names:
            run = planner.runner(c, key, coeffs, 1e-7, frozenset())
            try:
                run(x)
            except Exception as e:  # noqa: BLE001 - a candidate that cannot run here is reported and left out
                print(f"{b}x{m}x{n} {c}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            fns[c] = lambda run=run, x=x: run(x)
        torch.cuda.synchronize()
        idle, errors = interleaved_medians(fns, timer=latency_ms, budget_ms=3000, min_rounds=3, max_rounds=15)
        cap = capped_blocks(
            fns, idle, block_ms=block_ms, rounds=rounds, meter=meter, device_index=dev.index or 0
        )
        rows = {
            c: {
                "idle_ms": idle[c],
                "capped_ms": cap.ms[c],
                "capped_over_idle": cap.ms[c] / idle[c],
                "capped_j_per_call": cap.joules[c],
            }
            for c in idle
        }
        by_idle = sorted(rows, key=lambda c: rows[c]["idle_ms"])
        by_capped = sorted(rows, key=lambda c: rows[c]["capped_ms"])
        res["shapes"][f"{b}x{m}x{n}"] = {
            "rows": rows,
            "errors": errors,
            "fastest_idle": by_idle[0],
            "fastest_capped": by_capped[0],
            "nvidia_smi_medians": cap.smi,
        }
        print(f"{b}x{m}x{n}: fastest idle {by_idle[0]}, fastest capped {by_capped[0]}", flush=True)
        for c in by_capped[:8]:
            print(f"  {c:32s} idle {rows[c]['idle_ms']:8.3f}  capped {rows[c]['capped_ms']:8.3f}", flush=True)
    with open(args.get("out", "hot_plan.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
