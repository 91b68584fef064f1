"""Symmetric-kernel configs and the NS iterate's dtype on the problems of one plan file, side by side in one run.

    python -m experiments.ns_tiles.ns_tiles plan=FILE [out=DIR] [budget_ms=MS] [keys=SUBSTR,SUBSTR]

For every plain bf16-input NS problem named by the plan file's keys (batch, shape, coefficients, eps, as
`optim.kernels.plan.plan_key` writes them; e.g. `reports/megatron_h200_flops_202611/ns_plan_qwen3_slice_h200.json`,
the Qwen3 slice's shapes measured inside Megatron), on random inputs of that shape:

1. products: X X^T (K = n) and b A + c A^2 (K = m, epilogue from A), by cuBLAS (the full product: torch.bmm /
   baddbmm) and by each Triton symmetric config (`optim.kernels.sym_triton.TILE_CONFIGS`); median ms, the
   full-product-equivalent TFLOP/s (2 m^2 K per matrix over the time, so the columns compare directly), speedup
   over cuBLAS, and the largest error against the fp32 product.
2. whole NS: the plan's measurement (`Planner.choose`: every candidate timed, checked against cuBLAS) with the
   iterate in bf16 and in fp16 (a I folded into P), and each chosen body's error against fp32 Newton-Schulz on
   the first matrices.

Writes into out (default reports/ns_tiles_local): results.json, README.md (both tables), ns_plan.json (the plan
measured here, bf16 and fp16 keys; the file a Megatron run can be seeded with). GPU only.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_OUT = "reports/ns_tiles_local"
ERR_MATRICES = 4


def parse_args(argv: list[str]) -> dict[str, str]:
    """key=value arguments; unknown keys raise ValueError naming the allowed set."""
    allowed = {"plan", "out", "budget_ms", "keys"}
    args = {"out": DEFAULT_OUT, "budget_ms": "300"}
    for a in argv:
        k, sep, v = a.partition("=")
        if not sep or k not in allowed:
            raise ValueError(f"argument {a!r}: expected key=value with key in {sorted(allowed)}")
        args[k] = v
    if "plan" not in args:
        raise ValueError("plan=FILE is required (a plan cache json whose keys name the NS problems)")
    return args


def problems_from_plan(keys: list[str]) -> list[dict[str, Any]]:
    """Plain (gram=False) bf16-iterate problems of a plan file's keys: batch, rows, cols, coeffs, eps; distinct."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for key in keys:
        parts = key.split("|")
        fields = dict(p.split("=", 1) for p in parts if "=" in p and not p.startswith("eps"))
        eps = next((float(p[4:]) for p in parts if p.startswith("eps=")), None)
        shape = next((p for p in parts if p.count("x") == 2 and p.replace("x", "").isdigit()), None)
        if shape is None or eps is None or fields.get("gram") != "False" or "iterate" in fields:
            continue
        idx = parts.index(shape)
        if parts[idx + 1] != "torch.bfloat16":
            continue
        coeffs = tuple(tuple(float(v) for v in c.split("/")) for c in parts[idx + 2].split(","))
        nb, r, c = (int(v) for v in shape.split("x"))
        out[(nb, r, c, coeffs, eps)] = {"batch": nb, "rows": r, "cols": c, "coeffs": coeffs, "eps": eps}
    return sorted(out.values(), key=lambda p: -p["batch"] * p["rows"] * p["cols"])


def _median_ms(fn: Any, budget_ms: float) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once() -> float:
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    once()
    first = once()
    reps = max(3, min(25, int(budget_ms / max(first, 1e-3))))
    return statistics.median([once() for _ in range(reps)])


def product_rows(p: dict[str, Any], budget_ms: float) -> list[dict[str, Any]]:
    """X X^T and b A + c A^2 by cuBLAS and every symmetric config, for one problem."""
    import torch

    from optim.kernels.sym_triton import TILE_CONFIGS, sym_mm

    nb, r, c = p["batch"], p["rows"], p["cols"]
    m, n = min(r, c), max(r, c)
    x = torch.randn(nb, m, n, device="cuda").div_(n**0.5).bfloat16()
    a = torch.bmm(x, x.mT)
    b_, c_ = -4.7750, 2.0315  # quintic's b, c: magnitudes of a real step
    rows = []
    for prod, k, ref_fn in (
        ("X X^T", n, lambda: torch.bmm(x, x.mT)),
        ("bA + cA^2", m, lambda: torch.baddbmm(a, a, a.mT, beta=b_, alpha=c_)),
    ):
        ref = ref_fn().float()
        t_ref = _median_ms(ref_fn, budget_ms)
        flops = 2.0 * nb * m * m * k
        base = {"problem": f"{nb}x{m}x{n}", "product": prod, "K": k}
        rows.append(
            {**base, "impl": "cublas", "ms": t_ref, "tflops_equiv": flops / t_ref / 1e9, "speedup": 1.0}
        )
        for name, cfg in TILE_CONFIGS.items():
            if prod == "X X^T":

                def fn(cfg=cfg):  # type: ignore[no-untyped-def]
                    return sym_mm(x, x, config=cfg)
            else:

                def fn(cfg=cfg):  # type: ignore[no-untyped-def]
                    return sym_mm(a, a, alpha=c_, d=a, beta=b_, config=cfg)

            try:
                err = float((fn().float() - ref).abs().max() / ref.abs().max())
                t = _median_ms(fn, budget_ms)
            except Exception as e:  # noqa: BLE001 - a config that cannot run on this GPU is reported, not fatal
                rows.append({**base, "impl": name, "error": f"{type(e).__name__}: {str(e)[:200]}"})
                continue
            rows.append(
                {
                    **base,
                    "impl": name,
                    "ms": t,
                    "tflops_equiv": flops / t / 1e9,
                    "speedup": t_ref / t,
                    "max_rel_err": err,
                }
            )
        del ref
    return rows


def ns_rows(p: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's measurement of one problem with the iterate in bf16 and in fp16, and each choice's error."""
    import torch

    from optim.functional.newton_schulz import newton_schulz
    from optim.kernels import orthogonalize, plan_for

    nb, r, c = p["batch"], p["rows"], p["cols"]
    x = torch.randn(nb, r, c, device="cuda").bfloat16()
    ref = newton_schulz(
        x[:ERR_MATRICES].float(), coefficients=p["coeffs"], compute_dtype=torch.float32, eps=p["eps"]
    )
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        t0 = time.perf_counter()
        entry = plan_for(x, coeffs=p["coeffs"], eps=p["eps"], dtype=dtype)  # measured here on a cache miss
        method = str(entry["method"])
        out = orthogonalize(x, coeffs=p["coeffs"], eps=p["eps"], dtype=dtype)
        err = float((out[:ERR_MATRICES].float() - ref).norm() / ref.norm())
        times = dict(entry.get("times_ms") or {})  # type: ignore[call-overload]
        rows.append(
            {
                "problem": f"{nb}x{r}x{c}",
                "iterate": str(dtype).removeprefix("torch."),
                "method": method,
                "ms": times.get(method),
                "times_ms": times,
                "rejected": entry.get("rejected", {}),
                "rel_err_vs_fp32_ns": err,
                "plan_s": time.perf_counter() - t0,
            }
        )
        del out
    return rows


def render(res: dict[str, Any]) -> str:
    lines = [
        "# Symmetric-kernel configs and NS iterate dtype (experiments.ns_tiles.ns_tiles)",
        "",
        f"`{res['command']}` on {res['gpu']} ({res['versions']}). Products: median ms, full-product-equivalent",
        "TFLOP/s (2 m^2 K per matrix over the time), speedup over cuBLAS in the same run, max error vs fp32 / max.",
        "",
        "| problem | product | impl | ms | TFLOP/s equiv | x cuBLAS | max rel err |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in res["products"]:
        if "error" in row:
            lines.append(
                f"| {row['problem']} | {row['product']} | {row['impl']} | failed: {row['error']} | | | |"
            )
            continue
        err = f"{row['max_rel_err']:.2e}" if "max_rel_err" in row else ""
        lines.append(
            f"| {row['problem']} | {row['product']} | {row['impl']} | {row['ms']:.3f} | {row['tflops_equiv']:.0f} "
            f"| {row['speedup']:.2f} | {err} |"
        )
    lines += [
        "",
        "Whole NS (the plan's own measurement: every candidate timed; error of the chosen body vs fp32 NS on the",
        f"first {ERR_MATRICES} matrices):",
        "",
        "| problem | iterate | chosen | ms | t128 ms | plain_torch ms | rel err vs fp32 NS |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in res["ns"]:
        t = row["times_ms"]
        lines.append(
            f"| {row['problem']} | {row['iterate']} | {row['method']} | {row['ms']:.2f} "
            f"| {t.get('plain_sym_t128', float('nan')):.2f} | {t.get('plain_torch', float('nan')):.2f} "
            f"| {row['rel_err_vs_fp32_ns']:.2e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from muonbench.cli_help import module_help

    if module_help(__doc__, list(sys.argv[1:] if argv is None else argv)):
        return 0
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("experiments.ns_tiles.ns_tiles needs a CUDA GPU (run it on the H200)")
    import triton

    out = Path(args["out"])
    out.mkdir(parents=True, exist_ok=True)
    os.environ["MUONBENCH_CACHE"] = str(out)  # the plan measured here lands in out/ns_plan.json
    keys = list(json.loads(Path(args["plan"]).read_text()))
    problems = problems_from_plan(keys)
    if "keys" in args:
        want = args["keys"].split(",")
        problems = [p for p in problems if any(w == f"{p['batch']}x{p['rows']}x{p['cols']}" for w in want)]
    if not problems:
        raise SystemExit(f"plan={args['plan']}: no plain bf16 NS problem among its {len(keys)} keys")
    res: dict[str, Any] = {
        "command": "python -m experiments.ns_tiles.ns_tiles "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "gpu": torch.cuda.get_device_name(),
        "versions": f"torch {torch.__version__}, triton {triton.__version__}",
        "products": [],
        "ns": [],
    }
    budget = float(args["budget_ms"])
    for p in problems:
        tag = f"{p['batch']}x{p['rows']}x{p['cols']}"
        print(f"[ns_tiles] {tag}: products", flush=True)
        res["products"] += product_rows(p, budget)
        print(f"[ns_tiles] {tag}: whole NS bf16 / fp16", flush=True)
        res["ns"] += ns_rows(p)
        (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
        torch.cuda.empty_cache()
    text = render(res)
    (out / "README.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
