"""Does anything our optimizer leaves in the process slow the host's per-op dispatch? (session 3 diagnostic)

The session-3 profile (reports/megatron_h200_flops_202611/profile/) showed the same kernels for AdamW and ours in
forward-backward but ours' host ops ~20% slower (aten::view p50 1.8 -> 2.4 us), and the MoE dispatch is host-bound,
so the GPU idles longer. This times host-only dispatch (no sync inside the loops) in one fresh process, then again
after each thing ours does that AdamW does not: import Triton, compile and launch our Triton kernels, capture and
replay a CUDA graph, run the NS planner. Also: Megatron's per-tensor multi-tensor fallbacks vs the foreach
replacements (optim.megatron.multi_tensor) on the Qwen3 slice's 1,554 expert-shaped tensors.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch


def probe(label: str, rows: list[dict]) -> None:
    x = torch.empty(1024, device="cuda")
    y = torch.empty(1024, device="cuda")
    res = {"label": label}
    for name, fn, n in (
        ("view_us", lambda: x.view(-1), 20000),
        ("empty_us", lambda: torch.empty(256, device="cuda"), 10000),
        ("add_us", lambda: torch.add(x, y), 10000),
        ("py_loop_us", lambda: sum(range(50)), 20000),
    ):
        reps = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            reps.append((time.perf_counter() - t0) / n * 1e6)
            torch.cuda.synchronize()
        res[name] = round(statistics.median(reps), 3)
    res["threads"] = len(os.listdir("/proc/self/task"))
    rss_pages = int(Path("/proc/self/statm").read_text().split()[1])
    res["rss_gib"] = round(rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**30, 2)
    rows.append(res)
    print(json.dumps(res), flush=True)


def main() -> None:
    rows: list[dict] = []
    torch.cuda.init()
    torch.empty(1, device="cuda")
    probe("fresh", rows)
    probe("fresh again", rows)
    import triton  # noqa: F401

    probe("import triton", rows)
    from optim.kernels import fused_step

    grads = [torch.randn(768, 2048, device="cuda") for _ in range(8)]
    bufs = [torch.zeros_like(g) for g in grads]
    fused_step.momentum_pack(grads, bufs, beta=0.95, nesterov=True)
    torch.cuda.synchronize()
    probe("triton kernel compiled+run", rows)
    from optim.kernels import orthogonalize

    coeffs = [(3.4445, -4.775, 2.0315)] * 5
    os.environ["MUONBENCH_CACHE"] = "/tmp/nsplan_probe"
    for shape in ((1, 128, 2048), (1, 512, 2048), (16, 768, 2048)):
        orthogonalize(torch.randn(*shape, device="cuda"), coeffs=coeffs)
    torch.cuda.synchronize()
    probe("NS planner measured (graphs captured)", rows)
    for _ in range(20):
        orthogonalize(torch.randn(1, 128, 2048, device="cuda"), coeffs=coeffs)
    torch.cuda.synchronize()
    probe("NS replays", rows)
    import gc

    gc.collect()
    probe("after gc", rows)

    # Megatron's TE/Apex-less fallbacks vs optim.megatron.multi_tensor, 1,554 tensors of 768 x 2048 (fp32 main
    # grads / params -> bf16 model params), as on the Qwen3 slice.
    from megatron.core import utils as mu

    from optim.megatron import multi_tensor as mt

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1554
    src = [torch.randn(768, 2048, device="cuda") for _ in range(n)]
    dst = [torch.empty(768, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(n)]
    flag = torch.zeros(1, dtype=torch.int, device="cuda")

    def timed(fn, reps=5):
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) * 1e3)
        return round(statistics.median(ts), 2)

    mtr = {
        "n_tensors": n,
        "l2_megatron_local_ms": timed(lambda: mu.local_multi_tensor_l2_norm(0, flag, [src], False)),
        "l2_foreach_ms": timed(lambda: mt.l2_norm(0, flag, [src], False)),
        "copy_megatron_loop_ms": timed(lambda: [d.copy_(s) for s, d in zip(src, dst)]),
        "copy_foreach_ms": timed(lambda: mt.copy_this_to_that(src, dst)),
        "scale_megatron_local_ms": timed(lambda: mu.local_multi_tensor_scale(0, flag, [src, src], 1.0)),
        "scale_foreach_ms": timed(lambda: mt.scale(0, flag, [src, src], 0.999)),
    }
    a = float(mu.local_multi_tensor_l2_norm(0, flag, [src], False)[0])
    b = float(mt.l2_norm(0, flag, [src], False)[0])
    mtr["l2_rel_diff"] = abs(a - b) / a
    print(json.dumps(mtr), flush=True)
    out = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out, "host_probe.json"), "w") as f:
        json.dump({"probe": rows, "multi_tensor": mtr}, f, indent=1)


if __name__ == "__main__":
    main()
