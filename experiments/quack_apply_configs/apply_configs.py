"""Which of QuACK's SM90 tile configs computes the Newton-Schulz general product X <- a X + P X with the least time and
energy at the power cap?

In a quintic NS step on a Qwen3-30B-A3B expert batch, X <- a X + P X (P symmetric m x m, X m x n, K = m) takes about
half of the call (docs/ns_kernels_h200.md), and the NS plan runs it in QuACK's default SM90 config (pingpong
128 x 192 tiles, 2 x 1 clusters) or one of the two explicit configs of `optim.kernels.sym_quack.GENERAL_CONFIGS`.
QuACK's own tuning space (`quack.gemm_config._get_sm90_configs`) holds 44 configs: cooperative and pingpong tiles,
1 x 2 and 2 x 1 clusters, with and without swapping A and B. This script compiles each on the product
D = a X + P X of each shape (QuACK's `gemm_tuned.fn` with `config=`, as `QuackOps.full`), checks it against the
fp32 product, times every config that ran on an idle GPU (interleaved rounds, `optim.kernels.timing`), and the
`top` fastest of them with QuACK's default at the cap (`experiments.gpu_energy.capped_blocks`: ~`block_ms` blocks of
back-to-back calls, configs rotated, NVML joules per call).

Usage: `python -m experiments.quack_apply_configs.apply_configs [shapes=128x1536x2048,128x768x2048] [swap=1]
[top=12] [block_ms=300] [rounds=3] [out=quack_apply_configs.json]` (one SM90 GPU, quack-kernels 0.6.5).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from experiments.gpu_energy.gpu_energy import capped_blocks, energy_meter_or_none
from experiments.ns_plan_hot.hot_plan import parse_shapes

ALLOWED = {"shapes", "swap", "top", "block_ms", "rounds", "out"}


def parse_args(argv: list[str]) -> dict[str, Any]:
    """key=value arguments; unknown keys, malformed shapes and bad numbers raise before anything runs."""
    args = dict(a.split("=", 1) if "=" in a else (a, "") for a in argv)
    if set(args) - ALLOWED:
        raise ValueError(f"unknown arguments {sorted(set(args) - ALLOWED)}; allowed: {sorted(ALLOWED)}")
    out = {
        "shapes": parse_shapes(args.get("shapes", "128x1536x2048,128x768x2048")),
        "swap": args.get("swap", "1"),
        "top": int(args.get("top", "12")),
        "block_ms": float(args.get("block_ms", "300")),
        "rounds": int(args.get("rounds", "3")),
        "out": args.get("out", "quack_apply_configs.json"),
    }
    if out["swap"] not in ("0", "1"):
        raise ValueError(f"swap={out['swap']!r}: allowed 0 (QuACK's configs without swap_ab) or 1 (all)")
    out["swap"] = out["swap"] == "1"
    for key in ("top", "rounds"):
        if out[key] < 1:
            raise ValueError(f"{key}={out[key]}: must be at least 1")
    return out


def config_name(
    tile_m: int, tile_n: int, pingpong: bool, cluster_m: int, cluster_n: int, swap_ab: bool
) -> str:
    """`coop128x256_cl2x1`-style name of a QuACK SM90 config (the naming of `sym_quack.GENERAL_CONFIGS`), with
    `_swap` when A and B are swapped."""
    kind = "pp" if pingpong else "coop"
    return f"{kind}{tile_m}x{tile_n}_cl{cluster_m}x{cluster_n}" + ("_swap" if swap_ab else "")


def measure_shape(
    b: int, m: int, n: int, args: dict[str, Any], meter: Any, iface: Any, configs: list
) -> dict:
    """Compile time, error, idle and capped time of each config on one B x m x n product (module docstring)."""
    import torch

    from optim.kernels.timing import interleaved_medians, latency_ms

    dev = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(b, m, n, device=dev)
    x = (x / x.flatten(1).norm(dim=1).view(-1, 1, 1)).to(torch.bfloat16)
    a32 = x.float() @ x.float().mT
    p = (-4.8 * (a32 @ a32) + 3.4 * a32).to(torch.bfloat16)  # the shape of a quintic step's polynomial
    coef_a = 3.4445
    ref = p.float() @ x.float() + coef_a * x.float()
    scale = ref.abs().max().item()
    fns: dict[str, Any] = {}
    row: dict[str, Any] = {"compile_s": {}, "errors": {}, "failed": {}}

    def default() -> Any:
        return iface.gemm_add(p, x, x, alpha=1.0, beta=coef_a, tuned=False)

    candidates: list[tuple[str, Any]] = [("default", default)]
    for cfg in configs:
        out = torch.empty_like(x)

        def fn(cfg: Any = cfg, out: torch.Tensor = out) -> Any:
            iface.gemm_tuned.fn(p, x, out, x, alpha=1.0, beta=coef_a, config=cfg)
            return out

        name = config_name(cfg.tile_m, cfg.tile_n, cfg.pingpong, cfg.cluster_m, cfg.cluster_n, cfg.swap_ab)
        candidates.append((name, fn))
    for name, fn in candidates:
        t0 = time.perf_counter()
        try:
            d = fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a config QuACK cannot build here is reported and left out
            row["failed"][name] = f"{type(e).__name__}: {str(e)[:160]}"
            continue
        row["compile_s"][name] = time.perf_counter() - t0
        row["errors"][name] = ((d.float() - ref).abs().max() / scale).item()
        fns[name] = fn
    idle, failed = interleaved_medians(fns, timer=latency_ms, budget_ms=6000, min_rounds=3, max_rounds=15)
    row["failed"].update(failed)
    kept = sorted(idle, key=idle.get)[: args["top"]]
    if "default" in idle and "default" not in kept:
        kept.append("default")
    cap = capped_blocks(
        {c: fns[c] for c in kept},
        idle,
        block_ms=args["block_ms"],
        rounds=args["rounds"],
        meter=meter,
        device_index=dev.index or 0,
    )
    flop = 2.0 * b * m * m * n
    row["times"] = {
        c: {
            "idle_ms": idle[c],
            "idle_tflops": flop / idle[c] / 1e9,
            "capped_ms": cap.ms.get(c),
            "capped_j_per_call": cap.joules.get(c),
        }
        for c in sorted(idle, key=idle.get)
    }
    row["nvidia_smi_medians"] = cap.smi
    print(f"{b}x{m}x{n}: {len(idle)} configs ran, failed {sorted(row['failed'])}", flush=True)
    for c in sorted(kept, key=lambda c: cap.ms[c]):
        t, j = row["times"][c], cap.joules[c]
        print(
            f"  {c:26s} idle {t['idle_ms']:7.3f} ({t['idle_tflops']:4.0f} TF/s)  capped {cap.ms[c]:7.3f}"
            f"  J {j if j is None else round(j, 3)}  err {row['errors'][c]:.1e}",
            flush=True,
        )
    return row


def main(argv: list[str]) -> int:
    import torch

    from optim.kernels import sym_quack

    args = parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        raise SystemExit("quack_apply_configs needs an SM90 GPU")
    from quack.gemm_config import _get_sm90_configs

    configs = [c for c in _get_sm90_configs() if args["swap"] or not c.swap_ab]
    meter = energy_meter_or_none(torch.cuda.current_device())
    iface = sym_quack._iface()
    res: dict[str, Any] = {k: args[k] for k in ("swap", "top", "block_ms", "rounds")}
    res["shapes"] = {}
    for b, m, n in args["shapes"]:
        res["shapes"][f"{b}x{m}x{n}"] = measure_shape(b, m, n, args, meter, iface, configs)
        with open(args["out"], "w") as f:  # after every shape: nothing lost if a later shape fails
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
