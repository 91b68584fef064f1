"""Would folding the weight update into Newton-Schulz's last product save a Muon step's time at the power cap?

The fused Muon step ends each bucket with two passes over its parameters' elements: NS's last product
X5 = a X4 + P4 X4 (a GEMM whose epilogue reads X4 and writes X5 in bf16), then the update
p <- (1 - lr wd) p - lr s X5 (`optim.kernels.fused_step.apply_update`: reads X5 and p, writes p). Folded, the last
product writes the update itself: with P4' = P4 + a I (a strided add on P4's diagonal),
p <- (1 - lr wd) p - lr s P4' X4 is one GEMM with p as its fp32 accumulate-into output (QuACK's
`gemm_add_inplace`), 8 bytes per element instead of 14, but it needs the bucket's parameters as one strided
(B, r, c) tensor, and P4' rounds a + P4_ii to bf16.

This script times both on a bucket's shapes, as blocks of back-to-back calls at the GPU's power cap (after one block
that brings it there; the variants rotated per round), with NVML joules per call when nvidia-ml-py is present, and
checks the folded update against the unfused one.

Usage: `python -m experiments.update_fold.fold [shapes=128x1536x2048,128x2048x768] [block_ms=300] [rounds=5]
[out=fold.json]` (one CUDA GPU with quack-kernels). Shapes are B x rows x cols of the parameters; a tall parameter
(rows > cols) is orthogonalized in its wide orientation and updated through its transposed view.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

from experiments.gpu_energy.gpu_energy import SmiSampler, energy_meter_or_none


def parse_param_shapes(text: str) -> list[tuple[int, int, int]]:
    """ "B x rows x cols" triples separated by commas."""
    out = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"shapes: {item!r} is not BxRxC with positive integers (e.g. 128x1536x2048)")
        out.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return out


def _variants(
    nb: int, r: int, c: int, coeffs: list[Any], lr: float, wd: float
) -> tuple[dict[str, Callable[[], None]], float]:
    """The unfused and folded last NS product + update of a bucket of nb (r, c) parameters held in one (nb, r, c)
    buffer, and the relative difference of their updates (over the update's norm) from the same parameters."""
    import quack.gemm_interface as qg
    import torch

    from optim.kernels import fused_step as fs

    dev = torch.device("cuda")
    m, n = min(r, c), max(r, c)
    a4, b4, c4 = coeffs[-1]
    scale = max(1.0, r / c) ** 0.5
    gen = torch.Generator(device=dev).manual_seed(0)
    pbuf = torch.randn(nb, r, c, device=dev, generator=gen) * 0.02
    params = list(pbuf.unbind(0))
    pview = pbuf if r <= c else pbuf.mT  # (nb, m, n) view of the parameters
    # a realistic X4, P4: four quintic steps from a normalized Gaussian, in bf16
    x = torch.randn(nb, m, n, device=dev, generator=gen)
    x = (x / x.flatten(1).norm(dim=1).view(-1, 1, 1)).bfloat16()
    for a, b, cc in coeffs[:-1]:
        gram = x @ x.mT
        x = a * x + (b * gram + cc * gram @ gram) @ x
    gram = x @ x.mT
    p4 = (b4 * gram + c4 * gram @ gram).bfloat16().contiguous()
    x4 = x.bfloat16().contiguous()
    diag = p4.diagonal(dim1=-2, dim2=-1)
    diag0 = diag.clone()

    def unfused() -> None:
        x5 = qg.gemm_add(p4, x4, x4, alpha=1.0, beta=float(a4), tuned=False)
        fs.apply_update(params, x5, lr=lr, weight_decay=wd, scale=scale, transposed=r > c, checked=True)

    def folded() -> None:
        diag.add_(a4)
        qg.gemm_add_inplace(p4, x4, pview, alpha=-lr * scale, beta=1.0 - lr * wd, tuned=False)
        diag.copy_(diag0)

    p0 = pbuf.clone()
    unfused()
    ref = pbuf.clone()
    pbuf.copy_(p0)
    folded()
    rel = float((pbuf - ref).norm() / (ref - p0).norm())
    pbuf.copy_(p0)
    return {"unfused": unfused, "folded": folded}, rel


def main(argv: list[str]) -> int:
    import torch

    from optim.functional.newton_schulz import ns_coefficients

    args = dict(a.split("=", 1) for a in argv)
    allowed = {"shapes", "block_ms", "rounds", "out"}
    if set(args) - allowed:
        raise ValueError(f"unknown arguments {sorted(set(args) - allowed)}; allowed: {sorted(allowed)}")
    if not torch.cuda.is_available():
        raise SystemExit("update_fold needs a CUDA GPU")
    shapes = parse_param_shapes(args.get("shapes", "128x1536x2048,128x2048x768"))
    block_ms = float(args.get("block_ms", "300"))
    rounds = int(args.get("rounds", "5"))
    coeffs = ns_coefficients("quintic", 5)
    lr, wd = 1e-2, 0.1
    meter = energy_meter_or_none(0)
    res: dict[str, Any] = {"block_ms": block_ms, "rounds": rounds, "lr": lr, "weight_decay": wd, "shapes": {}}
    for nb, r, c in shapes:
        fns, rel = _variants(nb, r, c, coeffs, lr, wd)
        for f in fns.values():  # compile, warm up
            f()
        torch.cuda.synchronize()
        per_call: dict[str, list[float]] = {k: [] for k in fns}
        joules: dict[str, list[float]] = {k: [] for k in fns}
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fns["unfused"]()
        end.record()
        end.synchronize()
        k = max(5, round(block_ms / max(start.elapsed_time(end), 1e-3)))
        with SmiSampler(100, 0) as smi:
            for rnd in range(rounds + 1):  # round 0 brings the GPU to its cap; not kept
                for name in list(fns) if rnd % 2 == 0 else list(fns)[::-1]:
                    e0 = meter.read().energy_j if meter is not None else 0.0
                    start.record()
                    for _ in range(k):
                        fns[name]()
                    end.record()
                    end.synchronize()
                    if rnd:
                        per_call[name].append(start.elapsed_time(end) / k)
                        if meter is not None:
                            joules[name].append((meter.read().energy_j - e0) / k)
        rows = {
            name: {
                "capped_ms": statistics.median(per_call[name]),
                "capped_ms_all": per_call[name],
                "j_per_call": statistics.median(joules[name]) if joules[name] else None,
            }
            for name in fns
        }
        key = f"{nb}x{r}x{c}"
        res["shapes"][key] = {
            "rows": rows,
            "calls_per_block": k,
            "folded_vs_unfused_rel_error": rel,
            "folded_over_unfused_ms": rows["folded"]["capped_ms"] / rows["unfused"]["capped_ms"],
            "nvidia_smi_medians": smi.medians(),
        }
        print(
            f"{key}: unfused {rows['unfused']['capped_ms']:.3f} ms {rows['unfused']['j_per_call']} J, "
            f"folded {rows['folded']['capped_ms']:.3f} ms {rows['folded']['j_per_call']} J, "
            f"update rel. difference {rel:.2e}",
            flush=True,
        )
    with open(args.get("out", "fold.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
