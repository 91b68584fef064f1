"""QuACK's symmetric GEMM in other tile configs than the one it fixes per architecture, on the Muon NS products.

    python -m experiments.quack_sym_tiles.quack_sym_tiles [shapes=BxMxN,...] [configs=TMxTNxCMxP,...] [out=FILE]

quack-kernels 0.6.5 picks the symmetric GEMM's tiles from the compute capability alone
(`quack.gemm_interface._symmetric_gemm_config`: SM90 -> 128 x 256 tiles, 2-CTA clusters, cooperative). This probe
replaces that function for each config in turn (QuACK's cached call plans cleared between configs) and times both
symmetric products of a Newton-Schulz step on each (B, m, n) problem: X X^T (K = n) and b A + c A^2 with the
epilogue reading A (K = m), median of 20 calls (CUDA events, after 3 warm-up calls); TFLOP/s on the full product
(2 B m^2 K), first-call seconds (compilation) and the largest error against the bf16 cuBLAS product in fp32. A
config is `tile_m x tile_n x cluster_m x pingpong(0/1)`; QuACK needs one square (tile_m cluster_m = tile_n) per
cluster, and a config breaking that runs but writes a wrong product: its error column shows it. GPU (SM90) with
quack-kernels only; writes the table as JSON to `out` and prints it.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_SHAPES = "128x1536x2048,128x768x2048,256x768x2048"  # Qwen3-30B-A3B fc1, fc2, fc1 gate/up halves
DEFAULT_CONFIGS = "128x256x2x0,128x128x1x0,128x128x1x1,64x128x2x0"  # QuACK's SM90 default first
COEFFS = (-4.775, 2.0315)  # b, c of the first quintic step


def parse_args(argv: list[str]) -> dict[str, Any]:
    """key=value arguments -> shapes [(B, m, n)], configs [(tile_m, tile_n, cluster_m, pingpong)], out; a bad key
    or value raises ValueError naming what is allowed."""
    allowed = {"shapes", "configs", "out"}
    args = {"shapes": DEFAULT_SHAPES, "configs": DEFAULT_CONFIGS, "out": "quack_sym_tiles.json"}
    for a in argv:
        k, sep, v = a.partition("=")
        if not sep or k not in allowed:
            raise ValueError(f"argument {a!r}: expected key=value with key in {sorted(allowed)}")
        args[k] = v

    def ints(text: str, n: int, what: str) -> tuple[int, ...]:
        parts = text.split("x")
        if len(parts) != n or not all(p.isdigit() for p in parts):
            raise ValueError(f"{what}={text!r}: expected {n} integers joined by 'x'")
        return tuple(int(p) for p in parts)

    shapes = [ints(s, 3, "shapes") for s in args["shapes"].split(",")]
    configs = []
    for c in args["configs"].split(","):
        tm, tn, cm, pp = ints(c, 4, "configs")
        if pp not in (0, 1):
            raise ValueError(f"configs={c!r}: the last field (pingpong) must be 0 or 1")
        configs.append((tm, tn, cm, bool(pp)))
    return {"shapes": shapes, "configs": configs, "out": args["out"]}


def _median_ms(fn: Any, reps: int = 20) -> float:
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    return statistics.median(times)


def measure(shapes: list[tuple[int, ...]], configs: list[tuple[int, int, int, bool]]) -> list[dict[str, Any]]:
    import quack.gemm_interface as gi
    import torch

    b, c = COEFFS
    default = gi._symmetric_gemm_config
    rows = []
    try:
        for nb, m, n in shapes:
            x = torch.randn(nb, m, n, device="cuda", dtype=torch.bfloat16) / (m * n) ** 0.25
            a = torch.bmm(x, x.mT)
            ref_g = a.float()
            ref_p = b * a.float() + c * torch.bmm(a, a).float()
            for cfg in configs:
                gi._symmetric_gemm_config = lambda sm, cfg=cfg: cfg
                gi._gemm_symmetric_iface_plan_cache.clear()
                row: dict[str, Any] = {"shape": f"{nb}x{m}x{n}", "config": "x".join(str(int(v)) for v in cfg)}
                try:
                    t = time.perf_counter()
                    g = gi.gemm_symmetric(x, x.mT)
                    torch.cuda.synchronize()
                    row["first_call_s"] = time.perf_counter() - t
                    p = gi.gemm_symmetric(a, a.mT, a, alpha=c, beta=b)
                    row["err_gram"] = float((g.float() - ref_g).abs().max() / ref_g.abs().max())
                    row["err_poly"] = float((p.float() - ref_p).abs().max() / ref_p.abs().max())
                    row["gram_ms"] = _median_ms(lambda x=x: gi.gemm_symmetric(x, x.mT))
                    row["poly_ms"] = _median_ms(lambda a=a: gi.gemm_symmetric(a, a.mT, a, alpha=c, beta=b))
                    row["gram_tflops"] = 2 * nb * m * m * n / row["gram_ms"] / 1e9
                    row["poly_tflops"] = 2 * nb * m**3 / row["poly_ms"] / 1e9
                except Exception as e:  # noqa: BLE001 - a config QuACK rejects is a row, not the end of the probe
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        gi._symmetric_gemm_config = default
        gi._gemm_symmetric_iface_plan_cache.clear()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    rows = measure(args["shapes"], args["configs"])
    Path(args["out"]).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
