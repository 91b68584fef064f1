"""Kernel timeline of one optim.Muon step on the Qwen3-30B-A3B layer (CUDA): where the step's time goes.

Usage: `python -m experiments.optim_step_profile.profile_step [out=profile.json] [steps=3]
[impl=optim_muon|optim_muon_vouched]`.
Profiles `steps` steps after two warm-up steps with torch.profiler; writes per-kernel-family GPU time, the GPU's
idle time inside each step, and the step wall times; prints a summary.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict

from bench.tools.optim_step import layer_shapes


def family(name: str) -> str:
    n = name.lower()
    for key in (
        "momentum_pack",
        "apply_update",
        "scale_cast",
        "nonfinite",
        "sym",
        "gemm",
        "sm90",
        "nvjet",
        "cutlass",
        "triton",
        "reduce",
        "elementwise",
        "copy",
        "fill",
    ):
        if key in n:
            return key
    return name[:60]


def main(argv: list[str]) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench.tools.ns_kernels_measure import make_params
    from optim import Muon, MuonConfig

    args = dict(a.split("=", 1) for a in argv)
    out = args.get("out", "profile.json")
    steps = int(args.get("steps", "3"))
    vouched = args.get("impl", "optim_muon") == "optim_muon_vouched"
    ps = make_params(layer_shapes(1.0), "cuda")
    opt = Muon(ps, MuonConfig(lr=1e-4))

    def step() -> None:
        if vouched:
            opt.assume_finite_grads()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    walls = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.profiler.record_function("muon_step"):
                step()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t) * 1e3)
    evs = prof.events()
    kernels = sorted(
        [
            (e.time_range.start, e.time_range.end, e.name)
            for e in evs
            if e.device_type.name == "CUDA" and "#" not in e.name and e.name != "muon_step"
        ],
    )
    marks = sorted([(e.time_range.start, e.time_range.end) for e in evs if e.name == "muon_step"])
    rows = []
    for s0, s1 in marks:
        ks = [k for k in kernels if s0 <= k[0] < s1 + 200000]
        ks = [k for k in ks if k[0] < s1]
        fam: dict[str, float] = defaultdict(float)
        cnt: dict[str, int] = defaultdict(int)
        busy, idle, last, prev = 0.0, 0.0, None, ""
        gaps = []
        timeline = []
        for a, b, n in ks:
            timeline.append([round((a - ks[0][0]) / 1e3, 3), round((b - a) / 1e3, 3), n[:70]])
            fam[family(n)] += (b - a) / 1e3
            cnt[family(n)] += 1
            if last is not None and a > last:
                idle += (a - last) / 1e3
                gaps.append((round((a - last) / 1e3, 3), round((a - ks[0][0]) / 1e3, 3), prev[:50], n[:50]))
            last = max(last or b, b)
            prev = n
            busy += (b - a) / 1e3
        rows.append(
            {
                "cpu_ms": (s1 - s0) / 1e3,
                "gpu_first_to_last_ms": ((ks[-1][1] - ks[0][0]) / 1e3) if ks else 0,
                "kernel_ms": busy,
                "idle_ms": idle,
                "kernels": len(ks),
                "families": {k: [round(v, 3), cnt[k]] for k, v in sorted(fam.items(), key=lambda x: -x[1])},
                "largest_gaps": sorted(gaps, reverse=True)[:25],
                "host_start_to_first_kernel_ms": ((ks[0][0] - s0) / 1e3) if ks else 0,
                "last_kernel_to_host_end_ms": ((s1 - ks[-1][1]) / 1e3) if ks else 0,
                "timeline": timeline,
            }
        )
    res = {
        "walls_ms": walls,
        "median_wall_ms": statistics.median(walls),
        "steps": rows,
        "plans": __import__("optim.kernels", fromlist=["plans_in_use"]).plans_in_use(),
    }
    with open(out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    for r in rows:
        r2 = {k: v for k, v in r.items() if k != "timeline"}
        print(json.dumps(r2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
