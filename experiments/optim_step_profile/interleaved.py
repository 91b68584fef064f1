"""optim.Muon step variants on the Qwen3-30B-A3B layer, timed step by step in alternation (CUDA), with the GPU's
power and SM clock sampled by nvidia-smi: variants compared under the same thermal and power state.

Usage: `python -m experiments.optim_step_profile.interleaved [variants=optim_muon,no_side] [rounds=20]
[out=interleaved.json]`.

Variants: `optim_muon` (the fused step as shipped), `no_side` (the same with every bucket on the current stream),
`vouched` (gradients vouched finite, no screen). Each round steps every variant once, in rotated order.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    import torch

    from optim import Muon, MuonConfig
    from tools.ns_kernels_measure import make_params
    from tools.optim_step import layer_shapes

    args = dict(a.split("=", 1) for a in argv)
    names = args.get("variants", "optim_muon,no_side").split(",")
    rounds = int(args.get("rounds", "20"))
    opts = {}
    for n in names:
        opt = Muon(make_params(layer_shapes(1.0), "cuda"), MuonConfig(lr=1e-4))
        if n == "no_side":
            opt._side_buckets = lambda buckets: []
        opts[n] = opt

    def step(n: str) -> float:
        opt = opts[n]
        if n == "vouched":
            opt.assume_finite_grads()
        torch.cuda.synchronize()
        t = time.perf_counter()
        opt.step()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3

    for n in names:
        for _ in range(2):
            step(n)
    smi = subprocess.Popen(
        [
            "nvidia-smi",
            "--query-gpu=timestamp,power.draw,clocks.sm,temperature.gpu",
            "--format=csv,noheader",
            "-lms",
            "100",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            times[n].append(step(n))
    smi.terminate()
    samples = [line.split(", ") for line in smi.communicate()[0].splitlines() if line.count(",") == 3]
    res = {
        "rounds": rounds,
        "median_ms": {n: statistics.median(t) for n, t in times.items()},
        "first3_ms": {n: t[:3] for n, t in times.items()},
        "times_ms": times,
        "smi": samples,
    }
    with open(args.get("out", "interleaved.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res["median_ms"]), json.dumps(res["first3_ms"]))
    if samples:
        print(
            "power W, sm MHz (median):",
            statistics.median(float(s[1].split()[0]) for s in samples),
            statistics.median(float(s[2].split()[0]) for s in samples),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
