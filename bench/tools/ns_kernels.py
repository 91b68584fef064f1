"""Newton-Schulz kernel benchmark on one GPU: ours vs QuACK vs emerging-optimizers vs torch.optim.Muon, plus layer
steps.

    python -m bench.tools.ns_kernels [format=json] [out=DIR] [device=cpu] [eo_syrk=SHAPE,SHAPE|none] [syrk_timeout=S]
                               [error=0|1] [shapes=NAME,NAME]

On a GPU: measures the bf16 matmul ceiling; the two symmetric products of an NS step alone (X X^T and
b A + c A^2) by cuBLAS, each Triton tile config and QuACK, and the general product X <- a X + P X by cuBLAS and
each QuACK config the plan offers; then per shape (every distinct Qwen3-30B-A3B and Kimi K2
matrix, experts batched) the median ms of each NS implementation (ours = the per-shape plan; cublas and quack =
plain NS on one fixed backend; emerging-optimizers; torch.optim.Muon), nominal TFLOP/s on the plain-FLOP count,
fraction of the ceiling and the orthogonality error against the fp64 polar factor, and the plan's fastest
candidate of each family; then one optimizer step of a whole Qwen3-30B-A3B layer and of a Kimi K2 MoE layer at
EP64 (joint and split gate/up fc1 for optim.Muon). QuACK columns need quack-kernels (`muonbench[quack]`) on SM90+. Writes results.json, results.csv, README.md and ns.png
into out (default reports/ns_kernels_local). `device=cpu` runs a tiny smoke of the same code path (no timing
claims). Torch, Triton and emerging-optimizers are imported lazily so that the report code runs anywhere.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from bench.results import markdown

# name, rows (out), cols (in), batch, model, role
SHAPES: list[tuple[str, int, int, int, str, str]] = [
    ("qwen_q", 4096, 2048, 1, "qwen3-30b-a3b", "q after QKV split"),
    ("qwen_kv", 512, 2048, 1, "qwen3-30b-a3b", "k or v"),
    ("qwen_o", 2048, 4096, 1, "qwen3-30b-a3b", "attention out"),
    ("qwen_router", 128, 2048, 1, "qwen3-30b-a3b", "router"),
    ("qwen_fc1_x128", 1536, 2048, 128, "qwen3-30b-a3b", "expert fc1, one layer batched"),
    ("qwen_fc2_x128", 2048, 768, 128, "qwen3-30b-a3b", "expert fc2, one layer batched"),
    ("k2_expert_half_x8", 2048, 7168, 8, "kimi-k2", "expert gate/up half, batched (anchor shape)"),
    ("k2_fc1_x6", 4096, 7168, 6, "kimi-k2", "expert fc1, 6 local experts at EP64"),
    ("k2_fc2_x6", 7168, 2048, 6, "kimi-k2", "expert fc2, 6 local experts at EP64"),
    ("k2_q_down", 1536, 7168, 1, "kimi-k2", "MLA q down"),
    ("k2_q_up", 12288, 1536, 1, "kimi-k2", "MLA q up"),
    ("k2_kv_down", 576, 7168, 1, "kimi-k2", "MLA kv down"),
    ("k2_kv_up", 16384, 512, 1, "kimi-k2", "MLA kv up"),
    ("k2_router", 384, 7168, 1, "kimi-k2", "router"),
    ("k2_o", 7168, 8192, 1, "kimi-k2", "attention out"),
    ("k2_dense_fc2", 7168, 18432, 1, "kimi-k2", "dense fc2 (layer 1)"),
    ("k2_dense_fc1", 36864, 7168, 1, "kimi-k2", "dense fc1 (layer 1)"),
    ("square_8192", 8192, 8192, 1, "reference", "square"),
]
CPU_SHAPES: list[tuple[str, int, int, int, str, str]] = [
    ("tiny_wide", 32, 48, 1, "tiny", "cpu smoke"),
    ("tiny_tall_x3", 64, 40, 3, "tiny", "cpu smoke"),
]
# EO SYRK autotunes every new shape (up to 180 configs x 2 keys); these finished quickly before (docs/references.md#h200-baseline).
EO_SYRK_DEFAULT = ("qwen_q", "k2_o")
NUM_STEPS = 5
OURS_LABEL = (
    "ours / ours_gram: bench-local batched Muon step (fused momentum pack + plan-cached orthogonalize + fused "
    "update; ours_quack: the same with NS on QuACK's products, no plan); optim_muon / optim_muon_gram: the "
    "project's optim.Muon (shape-grouped batched NS through optim.kernels, per-parameter momentum and update); "
    "optim_muon_split: optim.Muon with each expert fc1 orthogonalized as its gate and up halves apart; all with EO "
    "Muon v0.3.0 defaults except lr = 1e-4"
)


def parse_args(argv: list[str]) -> dict[str, str]:
    """key=value arguments; unknown keys raise ValueError naming the allowed set."""
    allowed = {"format", "out", "device", "eo_syrk", "syrk_timeout", "error", "shapes"}
    args = {"format": "table", "out": "reports/ns_kernels_local", "device": "cuda", "error": "1"}
    for a in argv:
        k, sep, v = a.partition("=")
        if not sep or k not in allowed:
            raise ValueError(f"argument {a!r}: expected key=value with key in {sorted(allowed)}")
        args[k] = v
    if args["format"] not in ("table", "json"):
        raise ValueError(f"format={args['format']!r} is not one of ['json', 'table']")
    if args["device"] not in ("cuda", "cpu"):
        raise ValueError(f"device={args['device']!r} is not one of ['cpu', 'cuda']")
    return args


def plain_flops(rows: int, cols: int, batch: int = 1, steps: int = NUM_STEPS) -> float:
    """Plain NS FLOPs of `batch` rows x cols matrices (bench.flops' convention)."""
    from optim.cost import ns_flops

    return batch * ns_flops(rows, cols, steps, "plain")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    from muonbench.cli_help import module_help

    if module_help(__doc__, list(sys.argv[1:] if argv is None else argv)):
        return 0
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    from bench.tools import ns_kernels_measure as runner

    cpu = args["device"] == "cpu"
    if not cpu and not torch.cuda.is_available():
        raise SystemExit(
            "bench.tools.ns_kernels needs a CUDA GPU (run it on the H200); `device=cpu` runs a tiny smoke"
        )
    out = Path(args["out"])
    # A fresh plan cache next to the results: every shape's warm-up is measured and the choices are kept.
    os.environ.setdefault("MUONBENCH_CACHE", str(out))
    shapes = CPU_SHAPES if cpu else SHAPES
    if "shapes" in args:
        keep = set(args["shapes"].split(","))
        shapes = [s for s in shapes if s[0] in keep]
    syrk = () if cpu else tuple(args.get("eo_syrk", ",".join(EO_SYRK_DEFAULT)).split(","))
    res: dict[str, Any] = runner.run_all(
        shapes,
        device="cpu" if cpu else "cuda",
        eo_syrk=tuple(s for s in syrk if s and s != "none"),
        syrk_timeout=float(args.get("syrk_timeout", "60")),
        with_error=args["error"] == "1",
        log=log,
        checkpoint=lambda r: _checkpoint(r, out),
    )
    res["command"] = "python -m bench.tools.ns_kernels " + " ".join(sys.argv[1:] if argv is None else argv)
    write_outputs(res, out)
    if args["format"] == "json":
        print(json.dumps(res, indent=1, default=str))
    else:
        print(render_markdown(res))
    return 0


def _checkpoint(res: dict[str, Any], out: Path) -> None:
    """Partial results.json after every shape, so a run cut short still leaves its numbers."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))


def _fmt(v: Any, nd: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def ns_table_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat rows (one per shape x implementation) for the CSV and the markdown table."""
    rows = []
    ceiling = res.get("ceiling_tflops")
    for s in res["shapes"]:
        for impl, r in s["impls"].items():
            ms = r.get("ms")
            tf = plain_flops(s["rows"], s["cols"], s["batch"]) / ms / 1e9 if ms else None
            rows.append(
                {
                    "shape": s["name"],
                    "rows": s["rows"],
                    "cols": s["cols"],
                    "batch": s["batch"],
                    "impl": impl,
                    "ms": ms,
                    "ms_per_matrix": ms / s["batch"] if ms else None,
                    "tflops_plain": tf,
                    "frac_ceiling": tf / ceiling if (tf and ceiling) else None,
                    "ortho_err": r.get("ortho_err"),
                    "method": r.get("method"),
                    "warmup_s": r.get("warmup_s"),
                    "note": r.get("note", ""),
                }
            )
    return rows


PEERS = ("cublas", "quack", "eo_plain", "eo_syrk")


def plan_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Per shape: the plan's choice, its fastest candidate of each family, and ours against the fastest peer
    column of the same run (cuBLAS-only NS, QuACK-only NS, emerging-optimizers)."""
    rows = []
    for s in res["shapes"]:
        ours = s["impls"].get("ours", {})
        fb = ours.get("family_best") or {}
        peers = {p: s["impls"][p]["ms"] for p in PEERS if (s["impls"].get(p) or {}).get("ms")}
        fastest = min(peers, key=peers.__getitem__) if peers else None
        row = {
            "shape": s["name"],
            "batch": s["batch"],
            "method": ours.get("method"),
            "ours_ms": ours.get("ms"),
            "fastest_peer": fastest,
            "fastest_peer_ms": peers.get(fastest) if fastest else None,
        }
        for f in ("cublas", "triton_rowmajor", "triton", "quack"):
            name, ms = fb.get(f, (None, None))
            row[f"plan_{f}"], row[f"plan_{f}_ms"] = name, ms
        row["ours_vs_fastest_peer"] = (
            row["ours_ms"] / row["fastest_peer_ms"] if row["ours_ms"] and row["fastest_peer_ms"] else None
        )
        rows.append(row)
    return rows


def step_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for layer, d in res.get("steps", {}).items():
        base = d["impls"].get("adamw_fused", {}).get("ms")
        for impl, r in d["impls"].items():
            ms = r.get("ms")
            rows.append(
                {
                    "layer": layer,
                    "impl": impl,
                    "ms": ms,
                    "vs_adamw": ms / base if (ms and base) else None,
                    "ns_tflops_effective": d["ns_plain_flops"] / ms / 1e9
                    if ms and impl != "adamw_fused"
                    else None,
                    "first_step_ms": r.get("first_step_ms"),
                    "update_rel_err_vs_eo": r.get("update_rel_err_vs_eo"),
                    "phases_ms": "/".join(
                        _fmt(r.get(k)) for k in ("pack_ms", "orthogonalize_ms", "update_ms")
                    )
                    if "pack_ms" in r
                    else "",
                    "note": r.get("note", ""),
                }
            )
    return rows


def render_markdown(res: dict[str, Any]) -> str:
    lines = [
        f"# Newton-Schulz kernels on {res.get('device_name', '?')}",
        "",
        (
            f"Command: `{res.get('command', '')}`. Matmul ceiling (bf16 8192^3, same run): "
            f"{_fmt(res.get('ceiling_tflops'))} TFLOP/s."
        ),
        "",
        "Protocol: fp32 inputs (Gaussian), quintic coefficients, 5 steps, bf16 operands with fp32 accumulation;",
        "per-call latency on an idle GPU (CUDA events; the host waits for the GPU before each call, so host launch",
        "gaps count, as at the start of an optimizer step), the implementations of a shape timed in interleaved",
        "rounds (one call each per round, rotated; 5-40 rounds, ~0.4 s per implementation) after a warm-up round,",
        "median per implementation (`optim.kernels.timing`; the plan times its candidates the same way);",
        "TFLOP/s on the plain count k(4m^2n + 2m^3) per matrix, whatever the method computes;",
        "ortho_err = ||NS(x) - UV^T||_F / ||UV^T||_F",
        "against the fp64 polar factor (first matrices of a batch). torch.optim.Muon's NS uses its own 'simple'",
        "coefficients (not quintic), looped over a batch. `ours` times include nothing of the plan warm-up,",
        "which is reported separately (warmup_s: all candidates compiled, checked and timed).",
        "",
        "| shape | B | impl | ms | ms/matrix | TFLOP/s | % ceil | ortho err | method / note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ns_table_rows(res):
        pct = f"{100 * r['frac_ceiling']:.0f}" if r["frac_ceiling"] else "-"
        note = " ".join(x for x in (r["method"] or "", r["note"] or "") if x)
        if r["warmup_s"]:
            what = "plan warm-up" if r["impl"].startswith("ours") else "first call, compilation included"
            note += f" ({what} {r['warmup_s']:.1f} s)"
        lines.append(
            f"| {r['shape']} {r['rows']}x{r['cols']} | {r['batch']} | {r['impl']} | {_fmt(r['ms'])} | "
            f"{_fmt(r['ms_per_matrix'])} | {_fmt(r['tflops_plain'])} | {pct} | {_fmt(r['ortho_err'])} | {note} |"
        )
    lines += render_plan(res) + render_micro(res.get("product_micro") or [])
    lines += render_general(res.get("general_micro") or [])
    lines += ["", "## One-layer optimizer step", "", OURS_LABEL + ".", ""]
    lines += [
        (
            "| layer | impl | ms/step | vs fused AdamW | effective NS TFLOP/s | first step ms | update err vs EO "
            "| pack/orthogonalize/update ms | note |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in step_rows(res):
        lines.append(
            f"| {r['layer']} | {r['impl']} | {_fmt(r['ms'])} | {_fmt(r['vs_adamw'])} | "
            f"{_fmt(r['ns_tflops_effective'])} | {_fmt(r['first_step_ms'])} | {_fmt(r['update_rel_err_vs_eo'])} | "
            f"{r['phases_ms']} | {r['note']} |"
        )
    return "\n".join(lines) + "\n"


def render_plan(res: dict[str, Any]) -> list[str]:
    """The plan against its peers, one row per shape (`plan_rows`)."""
    from optim.kernels.plan import GRAPH_PREFERENCE, KEEP_WITHIN, MIN_ROUNDS

    rows = plan_rows(res)
    if not any(r["method"] for r in rows):
        return []
    lines = [
        "",
        "## The plan against its peers (ms)",
        "",
        "Plan columns: the fastest candidate of each family as the plan timed it (its own interleaved rounds, same",
        f"per-call protocol; after {MIN_ROUNDS} rounds a candidate whose fastest call is over {KEEP_WITHIN:.0%} behind",
        "the best median is timed no further);",
        "Triton row-major: the configs without grouped order or persistence. The plan choice is the fastest",
        f"candidate, or its CUDA-graph variant where that is within {GRAPH_PREFERENCE:.0%} of it (`plan.pick`). Peer",
        "columns (cublas, quack, eo_plain, eo_syrk) as timed above, in the same rounds as ours;",
        "`ours / fastest peer` <= 1.02 is the target.",
        "",
        "| shape | B | plan choice | cuBLAS | Triton row-major | Triton | QuACK | ours | fastest peer | ours / fastest peer |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(r: dict[str, Any], f: str) -> str:
        name, ms = r[f"plan_{f}"], r[f"plan_{f}_ms"]
        return f"{_fmt(ms)} ({name})" if name and f != "cublas" else _fmt(ms)

    for r in rows:
        peer = f"{_fmt(r['fastest_peer_ms'])} ({r['fastest_peer']})" if r["fastest_peer"] else "-"
        lines.append(
            f"| {r['shape']} | {r['batch']} | {r['method'] or '-'} | {cell(r, 'cublas')} | "
            f"{cell(r, 'triton_rowmajor')} | {cell(r, 'triton')} | {cell(r, 'quack')} | {_fmt(r['ours_ms'])} | "
            f"{peer} | {_fmt(r['ours_vs_fastest_peer'])} |"
        )
    return lines


def render_micro(micro: list[dict[str, Any]]) -> list[str]:
    """The symmetric products alone: cuBLAS, best Triton config, QuACK in its fixed tiles and, where measured, in each
    of its explicit symmetric tile configs (ms, errors, QuACK's first call)."""
    if not micro:
        return []
    from optim.kernels.sym_quack import SYMMETRIC_CONFIGS

    configs = [f"quack_{c}" for c in SYMMETRIC_CONFIGS if any(f"quack_{c}_ms" in r for r in micro)]
    extra_head = "".join(f" QuACK {c.removeprefix('quack_')} |" for c in configs)
    lines = [
        "",
        "## The two symmetric products of an NS step alone (ms)",
        "",
        "gram: X X^T (K = n); poly: b A + c A^2 with the epilogue reading A (K = m). cuBLAS computes the full",
        "product; Triton and QuACK one triangle (QuACK: its fixed SM90 tiles, 128 x 256 in 2-CTA clusters; other",
        "columns: its explicit tile configs). err: largest |out - fp32 product| over the largest |fp32 entry|.",
        "Every Triton config's time is in results.json.",
        "",
        (
            f"| product | B x m x K | cuBLAS | best Triton | QuACK |{extra_head} Triton / QuACK | "
            "err cuBLAS / Triton / QuACK | QuACK first call s |"
        ),
        "|---|---|---|---|---|" + "---|" * len(configs) + "---|---|---|",
    ]
    for r in micro:
        best, q = r.get("best_triton"), r.get("quack_ms")
        ratio = r["best_triton_ms"] / q if (best and q) else None
        errs = " / ".join(_fmt(r.get(f"{n}_err"), 2) for n in ("cublas", best or "-", "quack"))
        extra = "".join(f" {_fmt(r.get(f'{c}_ms'))} |" for c in configs)
        lines.append(
            f"| {r['product']} | {r['batch']}x{r['m']}x{r['k']} | {_fmt(r.get('cublas_ms'))} | "
            f"{_fmt(r.get('best_triton_ms'))} ({best or '-'}) | {_fmt(q)} |{extra} {_fmt(ratio)} | {errs} | "
            f"{_fmt(r.get('quack_first_s'))} |"
        )
    return lines


def render_general(micro: list[dict[str, Any]]) -> list[str]:
    """The general product alone per backend: cuBLAS, QuACK's default config and each explicit one (ms, TFLOP/s of
    the fastest, errors, QuACK's first calls)."""
    if not micro:
        return []
    backends = list(dict.fromkeys(k.removesuffix("_ms") for r in micro for k in r if k.endswith("_ms")))
    lines = [
        "",
        "## The general product of an NS step alone (ms)",
        "",
        "apply: X <- a X + P X with P of m x m and X of m x n (K = m), bf16 operands, fp32 accumulation;",
        "`quack`: QuACK's default SM90 config (pingpong 128 x 192, 2 x 1 cluster), `quack_<config>`: the explicit",
        "configs the plan also offers (`optim.kernels.sym_quack.GENERAL_CONFIGS`). TFLOP/s on 2 B m^2 n; err: largest",
        "|out - fp32 product| over the largest |fp32 entry|; first call s: compilation included.",
        "",
    ]
    rows = []
    for r in micro:
        best = r.get("best")
        fastest = f"{best} ({_fmt(r.get(f'{best}_tflops'))})" if best else "-"
        errs = " / ".join(_fmt(r.get(f"{b}_err"), 2) for b in backends)
        first = " / ".join(_fmt(r.get(f"{b}_first_s"), 2) for b in backends if b.startswith("quack"))
        cells = [_fmt(r.get(f"{b}_ms")) for b in backends]
        rows.append([f"{r['batch']}x{r['m']}x{r['n']}", *cells, fastest, errs, first or "-"])
    header = ["B x m x n", *backends, "fastest (TFLOP/s)", "err (same order)", "QuACK first call s"]
    return [*lines, *markdown.table(header, rows).splitlines()]


def write_outputs(res: dict[str, Any], out: Path) -> None:
    """results.json, results.csv (NS rows then step rows), README.md and ns.png (if matplotlib works)."""
    import csv

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    ns_rows, st_rows = ns_table_rows(res), step_rows(res)
    with open(out / "results.csv", "w", newline="") as f:
        keys = ["kind", *ns_rows[0].keys()] if ns_rows else ["kind"]
        keys += [k for k in (st_rows[0].keys() if st_rows else []) if k not in keys]
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in ns_rows:
            w.writerow({"kind": "ns", **r})
        for r in st_rows:
            w.writerow({"kind": "step", **r})
    (out / "README.md").write_text(render_markdown(res))
    try:
        plot(ns_rows, out / "ns.png", res.get("ceiling_tflops"))
    except Exception as e:  # noqa: BLE001 - a missing plotting backend must not lose the numbers
        log(f"plot skipped: {e}")


def plot(rows: list[dict[str, Any]], path: Path, ceiling: float | None) -> None:
    """Grouped bars: nominal TFLOP/s per shape and implementation, ceiling as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows if r["tflops_plain"]))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.9 * len(shapes)), 5))
    width = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        vals = {r["shape"]: r["tflops_plain"] or 0.0 for r in rows if r["impl"] == impl}
        ax.bar(
            [i + j * width for i in range(len(shapes))], [vals.get(s, 0.0) for s in shapes], width, label=impl
        )
    if ceiling:
        ax.axhline(ceiling, color="k", ls="--", lw=1, label=f"bf16 matmul ceiling {ceiling:.0f}")
    ax.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(shapes))], shapes, rotation=45, ha="right", fontsize=7
    )
    ax.set_ylabel("TFLOP/s (plain NS count)")
    ax.set_title("Newton-Schulz, 5 quintic steps, per shape")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    from bench import entry

    raise SystemExit(entry.run(main))
