"""optim.Muon step variants on the Qwen3-30B-A3B layer, timed step by step in alternation (CUDA), with the GPU's
power and SM clock sampled by nvidia-smi and the energy per step read from NVML (when nvidia-ml-py is present):
variants compared under the same thermal and power state.

Usage: `python -m experiments.optim_step_profile.interleaved [variants=optim_muon,no_side] [rounds=20]
[out=interleaved.json]`.

Variants: `optim_muon` (the fused step as shipped), `no_side` (the same with every bucket on the current stream),
`vouched` (gradients vouched finite, no screen). Each round steps every variant once, in rotated order.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from bench.tools.optim_step import layer_shapes
from experiments.gpu_energy.gpu_energy import SmiSampler, energy_meter_or_none

VARIANTS = ("optim_muon", "no_side", "vouched")


def main(argv: list[str]) -> int:
    import torch

    from bench.tools.ns_kernels_measure import make_params
    from optim import Muon, MuonConfig
    from optim.kernels.timing import rotation

    args = dict(a.split("=", 1) for a in argv)
    names = args.get("variants", "optim_muon,no_side").split(",")
    if set(names) - set(VARIANTS) or len(set(names)) != len(names):
        raise ValueError(f"variants={names}: distinct names among {VARIANTS}")
    rounds = int(args.get("rounds", "20"))
    opts = {}
    for n in names:
        opt = Muon(make_params(layer_shapes(1.0), "cuda"), MuonConfig(lr=1e-4))
        if n == "no_side":
            opt._side_buckets = lambda buckets: []
        opts[n] = opt

    meter = energy_meter_or_none(torch.cuda.current_device())
    joules: dict[str, list[float]] = {n: [] for n in names}

    def step(n: str) -> float:
        opt = opts[n]
        if n == "vouched":
            opt.assume_finite_grads()
        torch.cuda.synchronize()
        e0 = meter.read().energy_j if meter is not None else 0.0
        t = time.perf_counter()
        opt.step()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t) * 1e3
        if meter is not None:
            joules[n].append(meter.read().energy_j - e0)
        return ms

    for n in names:
        for _ in range(2):
            step(n)
    for j in joules.values():
        j.clear()  # the warm-up steps' joules
    times: dict[str, list[float]] = {n: [] for n in names}
    with SmiSampler(100, torch.cuda.current_device()) as smi:
        for r in range(rounds):
            for n in rotation(names, r):
                times[n].append(step(n))
    res = {
        "rounds": rounds,
        "median_ms": {n: statistics.median(t) for n, t in times.items()},
        "first3_ms": {n: t[:3] for n, t in times.items()},
        "times_ms": times,
        # NVML's energy counter (nvidia-ml-py), when present; it advances in coarse ticks, so per-step joules
        # are noisy and only their sums over the rounds compare
        "energy_j_per_step": {n: sum(j) / len(j) for n, j in joules.items() if j},
        "smi_samples": {
            "fields": "power W, SM clock MHz, temperature C",
            "every_ms": 100,
            "values": smi.samples,
        },
        "smi_medians": smi.medians(),
    }
    with open(args.get("out", "interleaved.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res["median_ms"]), json.dumps(res["first3_ms"]))
    print(
        "energy J per step:", json.dumps(res["energy_j_per_step"]), "nvidia-smi medians:", res["smi_medians"]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
