"""Can a memory-bound pack run beside the Newton-Schulz GEMMs for free at the H200's power cap?

Times, as back-to-back blocks of ~0.3 s (the GPU at its power cap), for each number of SMs left free by QuACK's
persistent GEMMs (`free`, by lowering their `max_active_clusters`): the planned NS of the Qwen3-30B-A3B expert fc1
stack alone (`ns`), the fused Muon pack of the fc2 stack alone (`pack`), both on one stream (`serial`) and the pack
on a second stream beside the NS (`concurrent`). Variants rotate round by round.

Usage: `python -m experiments.concurrent_pack.concurrent_pack [free=0,8,16,24] [rounds=5] [out=concurrent_pack.json]`
(CUDA, quack-kernels on the path).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import torch

from experiments.gpu_energy.gpu_energy import SmiSampler


def parse_frees(text: str, sms: int | None = None) -> list[int]:
    """`free=` as a list of distinct SM counts, each >= 0 and, given the device's SM count `sms`, below it."""
    try:
        frees = [int(f) for f in text.split(",")]
    except ValueError:
        raise ValueError(f"free={text!r}: comma-separated SM counts, e.g. free=0,8,16") from None
    bad = [f for f in frees if f < 0 or (sms is not None and f >= sms)]
    if bad or len(set(frees)) != len(frees):
        limit = f" and below the device's {sms} SMs" if sms is not None else ""
        raise ValueError(f"free={text!r}: distinct SM counts >= 0{limit}")
    return frees


def limit_sms(free: int) -> None:
    """QuACK's persistent GEMMs (and ours built on its kernels) launch for all SMs but `free`; plan caches cleared."""
    import quack.gemm
    import quack.gemm_interface
    import quack.gemm_symmetric

    import optim.kernels._quack_scaled as qs

    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def clusters(cluster_size: int, device_capacity: Any = None, device_id: int = 0) -> int:
        return (sms - free) // cluster_size

    for mod in (quack.gemm, quack.gemm_symmetric, qs):
        mod.get_max_active_clusters = clusters
    for cache in (
        quack.gemm._gemm_plan_cache,
        quack.gemm_symmetric._gemm_symmetric_plan_cache,
        quack.gemm_interface._gemm_iface_plan_cache,
        quack.gemm_interface._gemm_symmetric_iface_plan_cache,
        qs._PLANS,
    ):
        cache.clear()


def main(argv: list[str]) -> int:
    from optim.functional.newton_schulz import ns_coefficients
    from optim.kernels import fused_step as fs
    from optim.kernels import orthogonalize, plans_in_use
    from optim.kernels.timing import rotation

    args = dict(a.split("=", 1) for a in argv)
    allowed = {"free", "rounds", "out"}
    if set(args) - allowed:
        raise ValueError(f"unknown arguments {sorted(set(args) - allowed)}; allowed: {sorted(allowed)}")
    if not torch.cuda.is_available():
        raise SystemExit("experiments.concurrent_pack needs a CUDA device (and quack-kernels on the path)")
    frees = parse_frees(
        args.get("free", "0,8,16,24"), torch.cuda.get_device_properties(0).multi_processor_count
    )
    rounds = int(args.get("rounds", "5"))
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    coeffs = ns_coefficients("quintic", 5)
    x = torch.randn(128, 1536, 2048, device=dev, generator=gen).to(torch.bfloat16)
    sumsq = x.float().square().sum((1, 2))
    grads = [torch.randn(768, 2048, device=dev, generator=gen) for _ in range(128)]
    bufs = [torch.randn(768, 2048, device=dev, generator=gen) for _ in range(128)]
    aux = torch.cuda.Stream()
    main_s = torch.cuda.current_stream()

    def ns() -> None:
        orthogonalize(x, coeffs=coeffs, sumsq=sumsq)

    def pack() -> None:
        fs.momentum_pack_with_norms(grads, bufs, beta=0.95, nesterov=True, checked=True)

    def serial() -> None:
        pack()
        ns()

    def concurrent() -> None:
        aux.wait_stream(main_s)
        with torch.cuda.stream(aux):
            pack()
        ns()
        main_s.wait_stream(aux)

    bodies = {"ns": ns, "pack": pack, "serial": serial, "concurrent": concurrent}
    for f in frees:  # compile and plan every variant first
        limit_sms(f)
        for b in bodies.values():
            b()
    torch.cuda.synchronize()

    def block(body: Any) -> float:
        torch.cuda.synchronize()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.3:
            body()
            n += 1
            if n % 4 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3 / n

    names = [f"{b}@{f}" for f in frees for b in bodies]
    times: dict[str, list[float]] = {n: [] for n in names}
    with SmiSampler(100, 0) as smi:
        for r in range(rounds):
            for n in rotation(names, r):
                b, f = n.split("@")
                limit_sms(int(f))
                times[n].append(block(bodies[b]))
    med = {n: round(statistics.median(t), 3) for n, t in times.items()}
    res = {"median_ms": med, "times_ms": times, "smi_medians": smi.medians(), "plans": plans_in_use()}
    with open(args.get("out", "concurrent_pack.json"), "w") as fh:
        json.dump(res, fh, indent=1, default=str)
    for f in frees:
        print(f"free={f}: " + "  ".join(f"{b} {med[f'{b}@{f}']:.3f}" for b in bodies))
    print("nvidia-smi medians:", smi.medians())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
