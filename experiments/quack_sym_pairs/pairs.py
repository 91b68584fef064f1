"""Does the paired triangular schedule (`optim.kernels._quack_paired`) make QuACK's symmetric products cheaper at the power cap?

A Qwen3-30B-A3B layer's optimizer step runs its Newton-Schulz products at the H200's 700 W cap, where a kernel's time
follows its energy (docs/ns_kernels_h200.md). QuACK's symmetric GEMM either computes 256 x 256 squares (128 x 256
tiles, 2-CTA clusters multicasting the shared panel: 84 tile-equivalents where 78 hold a 1536-row triangle) or, in
128 x 128 pingpong tiles without clusters, the 78 tiles with every panel loaded by each CTA (the NS plan's choice on
the Qwen3 expert batches). The paired schedule computes the 78 tiles in 2-CTA clusters that multicast their shared
column panel. This script times the three on the same per-matrix scaled epilogue (`optim.kernels._quack_scaled`):

- `default`: 128 x 256 tiles, 2 x 1 clusters, cooperative (QuACK's SM90 symmetric config);
- `pp`: 128 x 128 pingpong tiles, no cluster (the plan's `sym128pp`);
- `paired`: 128 x 128 pingpong tiles, 2 x 1 clusters on the paired schedule.

Per shape B x m x k: X X^T (K = k), c A^2 + b A (K = m) and the whole quintic NS (5 steps, the general product
X <- a X + P X in QuACK's default for all three), each as the per-call latency on an idle GPU (median of interleaved
rounds, `optim.kernels.timing`) and as the mean per call of ~`block_ms` blocks of back-to-back calls at the cap
(median of `rounds` blocks, variants rotated), with NVML joules per call; errors against fp32 products; the NS
results of `paired` and `default` against `pp`.

Usage: `python -m experiments.quack_sym_pairs.pairs [shapes=128x1536x2048,128x768x2048,256x768x2048]
[block_ms=300] [rounds=5] [out=quack_sym_pairs.json]` (one SM90 GPU, quack-kernels 0.6.5).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from experiments.gpu_energy.gpu_energy import capped_blocks, energy_meter_or_none
from experiments.ns_plan_hot.hot_plan import parse_shapes

VARIANTS = ("default", "pp", "paired")
ALLOWED = {"shapes", "block_ms", "rounds", "out"}


def parse_args(argv: list[str]) -> dict[str, Any]:
    """key=value arguments; unknown keys and malformed shapes raise before anything runs."""
    args = dict(a.split("=", 1) if "=" in a else (a, "") for a in argv)
    if set(args) - ALLOWED:
        raise ValueError(f"unknown arguments {sorted(set(args) - ALLOWED)}; allowed: {sorted(ALLOWED)}")
    return {
        "shapes": parse_shapes(args.get("shapes", "128x1536x2048,128x768x2048,256x768x2048")),
        "block_ms": float(args.get("block_ms", "300")),
        "rounds": int(args.get("rounds", "5")),
        "out": args.get("out", "quack_sym_pairs.json"),
    }


def _sym(variant: str):
    from optim.kernels._quack_paired import paired_symmetric
    from optim.kernels._quack_scaled import scaled_symmetric

    if variant == "paired":
        return paired_symmetric
    tiles = (128, 256, 2, False) if variant == "default" else (128, 128, 1, True)
    return lambda a, b, out, u, c=None, v=None: scaled_symmetric(a, b, out, u, c, v, *tiles)


def measure_shape(
    b: int, m: int, k: int, args: dict[str, Any], meter: Any, coeffs: Any, gemm_add: Any
) -> dict:
    """Errors and times of the three variants on one B x m x k shape (module docstring)."""
    import torch

    from optim.kernels.timing import interleaved_medians, latency_ms

    dev = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(b, m, k, device=dev)
    x = (x / x.flatten(1).norm(dim=1).view(-1, 1, 1)).to(torch.bfloat16)
    ones = torch.ones(b, m, device=dev)
    a_ref = x.float() @ x.float().mT
    a16 = a_ref.to(torch.bfloat16)
    cb, cc = 2.5, -1.5
    p_ref = cc * (a16.float() @ a16.float()) + cb * a16.float()
    bufs = {v: (torch.empty_like(a16), torch.empty_like(a16)) for v in VARIANTS}
    steps = [(float(ca), ones * cb_, ones * cc_) for ca, cb_, cc_ in coeffs]
    ucb, ucc = ones * cb, ones * cc

    def ns(v: str, x: torch.Tensor = x) -> torch.Tensor:
        sym, y = _sym(v), x
        a, p = bufs[v]
        for ca, ub, uc in steps:
            sym(y, y, a, ones)
            sym(a, a, p, uc, a, ub)
            y = gemm_add(p, y, y, alpha=1.0, beta=ca, tuned=False)
        return y

    fns: dict[str, Any] = {}
    row: dict[str, Any] = {"errors": {}}
    for v in VARIANTS:
        sym = _sym(v)
        a, p = bufs[v]
        sym(x, x, a, ones)
        sym(a16, a16, p, ucc, a16, ucb)
        torch.cuda.synchronize()
        row["errors"][v] = {
            "gram": ((a.float() - a_ref).abs().max() / a_ref.abs().max()).item(),
            "poly": ((p.float() - p_ref).abs().max() / p_ref.abs().max()).item(),
        }
        fns[f"gram/{v}"] = lambda sym=sym, a=a: sym(x, x, a, ones)
        fns[f"poly/{v}"] = lambda sym=sym, p=p: sym(a16, a16, p, ucc, a16, ucb)
        fns[f"ns/{v}"] = lambda v=v: ns(v)
    outs = {v: ns(v).float() for v in VARIANTS}
    row["ns_vs_pp"] = {v: ((outs[v] - outs["pp"]).abs().max()).item() for v in VARIANTS}
    torch.cuda.synchronize()
    idle, failed = interleaved_medians(fns, timer=latency_ms, budget_ms=4000, min_rounds=3, max_rounds=15)
    cap = capped_blocks(
        fns, idle, block_ms=args["block_ms"], rounds=args["rounds"], meter=meter, device_index=dev.index or 0
    )
    row["times"] = {
        c: {"idle_ms": idle[c], "capped_ms": cap.ms[c], "capped_j_per_call": cap.joules[c]} for c in idle
    }
    row["failed"] = failed
    row["nvidia_smi_medians"] = cap.smi
    print(f"{b}x{m}x{k} errors {row['errors']} ns_vs_pp {row['ns_vs_pp']}", flush=True)
    for c, t in row["times"].items():
        j = t["capped_j_per_call"]
        print(
            f"  {c:14s} idle {t['idle_ms']:8.3f}  capped {t['capped_ms']:8.3f}  J {j if j is None else round(j, 3)}",
            flush=True,
        )
    return row


def main(argv: list[str]) -> int:
    import torch

    from optim.functional.newton_schulz import ns_coefficients
    from optim.kernels import sym_quack

    args = parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        raise SystemExit("quack_sym_pairs needs an SM90 GPU")
    dev = torch.device("cuda")
    meter = energy_meter_or_none(dev.index or 0)
    coeffs = ns_coefficients("quintic", 5)
    gemm_add = sym_quack._iface().gemm_add
    res: dict[str, Any] = {"block_ms": args["block_ms"], "rounds": args["rounds"], "shapes": {}}
    for b, m, k in args["shapes"]:
        row = measure_shape(b, m, k, args, meter, coeffs, gemm_add)
        res["shapes"][f"{b}x{m}x{k}"] = row
    with open(args["out"], "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
