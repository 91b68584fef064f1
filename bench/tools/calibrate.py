"""Measure this GPU at a model's shapes and write its hardware profile: `muonbench calibrate` (needs CUDA).

    muonbench calibrate model=qwen3_8b hardware=h100 [parallelism=...] [budget_s=170] [out=FILE] [slice=megatron]

Within `budget_s` (default 170 s, the NS plan included) it times, with CUDA events around each call after a warm-up
and the median over repeats: the dense GEMMs of the composed model (attention projections, MLP; fprop shapes at
micro-batch x sequence tokens), its routed experts as one grouped GEMM per layer, causal SDPA forward + backward at
its heads and sequence, an HBM copy and a fused AdamW step (`perfmodel.hwprofile`'s scaling reference), and the NS
plan (`optim.kernels.plan_for`, the planner's own measuring) at the model's Muon shapes. `slice=megatron|bridge`
also runs a short `bench.run` of the config and records its median step. The profile (`perfmodel.hwprofile`
schema) goes to `out` (default: the user's profile folder, one file per GPU name), where `project`, `recommend`
and `compare` read it for that hardware group. The hardware group must be this GPU's (refused otherwise).
The shape lists and the profile's bookkeeping are plain Python; only `measure` needs torch and CUDA.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import entry, nvsmi
from bench.tools.project import split_args

CLI_KEYS = ("budget_s", "out", "slice")
DEFAULT_BUDGET_S = 170.0
SHARES = {"dense": 0.2, "grouped": 0.15, "attention": 0.1, "hbm": 0.05, "ns_plan": 0.5}
"""Fractions of the budget per benchmark (the NS plan times every candidate kernel of every shape)."""
REPEATS = 20
"""Timed calls per shape at most (fewer when its share of the budget runs out; at least 3)."""
HBM_BYTES = 2**30
"""Bytes copied per HBM call: far beyond any L2."""
ADAMW_PARAMS = 128 * 2**20
"""fp32 parameters of the fused AdamW step (28 B each, `constants.HBM_EFFICIENCY`'s accounting)."""
SLICES = ("megatron", "bridge")


def workload(cfg: Any) -> dict[str, Any]:
    """The shapes `measure` times for a composed config: dense (m, n, k) GEMMs, grouped (groups, tokens per group,
    n, k) expert GEMMs, the attention problem and the Muon NS stacks (batch, rows, cols), from `bench.flops`."""
    from bench import flops

    model, par = cfg.model, cfg.parallelism
    tokens = par.mbs * model.seq_length
    mats = flops.enumerate_ns_matrices(model, split_qkv=False)
    dense = sorted({(tokens, m.rows, m.cols) for m in mats if not m.expert and m.kind != "router"})
    grouped = []
    if model.num_experts:
        local = max(1, model.num_experts // par.ep)
        per_expert = max(1, tokens * model.moe_router_topk // model.num_experts)
        grouped = sorted({(local, per_expert, m.rows, m.cols) for m in mats if m.expert})
    n_layers = model.num_layers + model.mtp_num_layers
    attention = {
        "batch": par.mbs,
        "heads": model.num_attention_heads,
        "kv_heads": model.num_query_groups or model.num_attention_heads,
        "seq": model.seq_length,
        "head_dim": model.kv_channels,
        "flop": flops.model_flops_breakdown(model, tp=1)["attn_core"] / n_layers * tokens,
    }
    ns = sorted(
        {(max(1, m.per_layer // par.ep) if m.expert else m.per_layer, min(m.rows, m.cols), max(m.rows, m.cols))
         for m in mats}
    )  # fmt: skip
    return {"dense": dense, "grouped": grouped, "attention": attention, "ns": ns}


def slug(gpu_name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", gpu_name.lower()).strip("_")


def profile_doc(
    *, hardware: str, gpu: dict[str, str], measured: dict[str, Any], model: str, command: str, date: str
) -> dict[str, Any]:
    """A hardware profile (`hwprofile.SCHEMA_VERSION`) of `measure`'s results; class rates are total FLOPs over
    total time of the class's shapes (the model's mix), as the model charges them."""
    from bench.tools.perfmodel import hwprofile

    tflops = {}
    for cls in hwprofile.TFLOPS_CLASSES:
        rows = measured.get(cls) or []
        if rows:
            tflops[cls] = sum(r["flop"] for r in rows) / sum(r["ms"] for r in rows) / 1e9
    return {
        "schema_version": hwprofile.SCHEMA_VERSION,
        "name": f"{slug(gpu['name'])}",
        "hardware": hardware,
        "gpu": gpu,
        "date": date,
        "command": command,
        "source": f"measured by muonbench calibrate at the shapes of model={model}",
        "tflops": tflops,
        "hbm_gbps": measured.get("hbm_gbps", {}),
        "ns_plan_ms": measured.get("ns_plan_ms", {}),
        "shapes": {cls: measured.get(cls) or [] for cls in hwprofile.TFLOPS_CLASSES},
        **({"slice": measured["slice"]} if "slice" in measured else {}),
    }


def median_ms(fn: Callable[[], object], deadline: float, repeats: int = REPEATS, warmup: int = 2) -> float:
    """Median milliseconds of `fn` by the NS plan's timing protocol (`optim.kernels.timing.latency_ms`: one call
    started on an idle GPU): `warmup` untimed calls, then up to `repeats` timed ones (at least 3; no more once
    `deadline`, a `time.perf_counter` value, has passed)."""
    from optim.kernels.timing import latency_ms

    for _ in range(warmup):
        fn()
    times: list[float] = []
    while len(times) < repeats and (len(times) < 3 or time.perf_counter() < deadline):
        times.append(latency_ms(fn))
    return statistics.median(times)


def measure(cfg: Any, shapes: dict[str, Any], budget_s: float) -> dict[str, Any]:
    """Time `workload`'s shapes on this CUDA device within `budget_s` (`SHARES` per benchmark, a share left over
    passing to the next); shapes whose share ran out are listed under `skipped`."""
    import torch

    t0 = time.perf_counter()
    out: dict[str, Any] = {"skipped": []}
    deadline = t0
    for name, bench in (("dense", _dense), ("grouped", _grouped), ("attention", _attention), ("hbm", _hbm)):
        deadline = max(deadline, time.perf_counter()) + SHARES[name] * budget_s
        out.update(bench(shapes, deadline, out["skipped"]))
        torch.cuda.empty_cache()
    deadline = max(deadline, time.perf_counter()) + SHARES["ns_plan"] * budget_s
    out["ns_plan_ms"] = ns_plan(cfg, shapes["ns"], deadline, out["skipped"])
    out["seconds"] = time.perf_counter() - t0
    return out


def _dense(shapes: dict[str, Any], deadline: float, skipped: list[Any]) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    rows = []
    for m, n, k in shapes["dense"]:
        if time.perf_counter() > deadline:
            skipped.append(["dense", m, n, k])
            continue
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        ms = median_ms(lambda a=a, w=w: F.linear(a, w), deadline)
        rows.append({"m": m, "n": n, "k": k, "ms": ms, "flop": 2.0 * m * n * k})
    return {"dense": rows}


def _grouped(shapes: dict[str, Any], deadline: float, skipped: list[Any]) -> dict[str, Any]:
    """One grouped GEMM over every local expert (as `bench.engines.megatron_experts` runs them)."""
    import torch
    import torch.nn.functional as F

    grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
    rows = []
    for g, t, n, k in shapes["grouped"] if grouped_mm is not None else []:
        if time.perf_counter() > deadline:
            skipped.append(["grouped", g, t, n, k])
            continue
        x = torch.randn(g * t, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(g, k, n, device="cuda", dtype=torch.bfloat16)
        offs = torch.arange(1, g + 1, device="cuda", dtype=torch.int32) * t
        ms = median_ms(lambda x=x, w=w, offs=offs: grouped_mm(x, w, offs=offs), deadline)
        rows.append({"groups": g, "m": t, "n": n, "k": k, "ms": ms, "flop": 2.0 * g * t * n * k})
    return {"grouped": rows}


def _attention(shapes: dict[str, Any], deadline: float, skipped: list[Any]) -> dict[str, Any]:
    """Causal SDPA forward + backward of one layer at the model's heads, groups and sequence."""
    import torch
    import torch.nn.functional as F

    a = shapes["attention"]
    q = torch.randn(a["batch"], a["heads"], a["seq"], a["head_dim"], device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)  # fmt: skip
    k, v = (torch.randn(a["batch"], a["kv_heads"], a["seq"], a["head_dim"], device="cuda", dtype=torch.bfloat16,
                        requires_grad=True) for _ in range(2))  # fmt: skip
    grad = torch.randn_like(q)

    def step() -> None:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=a["kv_heads"] != a["heads"])
        o.backward(grad)

    return {"attention": [{**a, "ms": median_ms(step, deadline)}]}


def _hbm(shapes: dict[str, Any], deadline: float, skipped: list[Any]) -> dict[str, Any]:
    """GB/s of a device-to-device copy and of a fused AdamW step (28 B per fp32 parameter)."""
    import torch

    src = torch.empty(HBM_BYTES // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src), deadline)
    p = torch.zeros(ADAMW_PARAMS, device="cuda", requires_grad=True)
    p.grad = torch.zeros_like(p)
    adamw = torch.optim.AdamW([p], fused=True)
    adamw_ms = median_ms(adamw.step, deadline)
    return {"hbm_gbps": {"copy": 2 * HBM_BYTES / copy_ms / 1e6, "adamw": 28 * ADAMW_PARAMS / adamw_ms / 1e6}}


def ns_plan(cfg: Any, stacks: list[tuple[int, int, int]], deadline: float, skipped: list[Any]) -> dict[str, float]:
    """Plan key -> milliseconds of the chosen method, planned as a Muon step plans them (`optim.kernels.plan_for`,
    the configured coefficients, eps, Gram-NS and NS precision)."""
    import torch

    from optim import kernels
    from optim.functional.newton_schulz import ns_coefficients
    from optim.kernels import plan

    o = cfg.optimizer
    coeffs = ns_coefficients(o.coefficient_type, o.num_ns_steps, o.custom_coefficients or None)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[o.ns_precision]
    out = {}
    for batch, m, n in stacks:
        if time.perf_counter() > deadline:
            skipped.append(["ns_plan", batch, m, n])
            continue
        x = torch.randn(batch, m, n, device="cuda", dtype=torch.bfloat16)
        restarts = tuple(o.gram_restart_iterations)
        entry = kernels.plan_for(x, coeffs=coeffs, eps=o.eps, use_gram=o.use_gram_ns, restart_iterations=restarts,
                                 dtype=dtype)  # fmt: skip
        key = plan.plan_key(plan.env_key(x.device), x, coeffs, o.eps, o.use_gram_ns, frozenset(restarts), dtype)
        times = entry.get("times_ms") or {}
        if entry["method"] in times:
            out[key] = float(times[entry["method"]])
        del x
    return out


def run_slice(overrides: list[str], engine: str, folder: Path) -> dict[str, Any]:
    """Median step seconds of a short `bench.run` of the config with `engine` (its record in `folder`)."""
    cmd = [sys.executable, "-m", "bench.run", *overrides, f"engine={engine}", "bench.steps=12",
           f"bench.out_dir={folder}"]  # fmt: skip
    proc = subprocess.run(cmd, check=False)
    recs = sorted(folder.glob("**/run.json"))
    summary = json.loads(recs[-1].read_text()).get("summary") or {} if recs else {}
    return {"engine": engine, "returncode": proc.returncode, "step_s_median": summary.get("step_s_median"),
            "command": " ".join(cmd)}  # fmt: skip


def gpu_facts() -> dict[str, str]:
    import torch

    rows = nvsmi.query(("driver_version",))
    return {
        "name": torch.cuda.get_device_name(0),
        "compute_capability": "{}.{}".format(*torch.cuda.get_device_capability(0)),
        "driver": rows[0][0] if rows else "unknown",
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
    }


def parse_cli(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The CLI-only keys (checked: ValueError naming the key, its value and the allowed set) and the overrides."""
    cli, overrides = split_args(argv, CLI_KEYS)
    try:
        budget = float(cli.get("budget_s", DEFAULT_BUDGET_S))
    except ValueError:
        budget = -1.0
    if not 10 <= budget <= 600:
        raise ValueError(f"budget_s={cli.get('budget_s')!r}: must be a number of seconds in [10, 600]")
    if cli.get("slice") not in (None, *SLICES):
        raise ValueError(f"slice={cli['slice']!r}: must be one of {list(SLICES)}")
    return {**cli, "budget_s": budget}, overrides


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    from muonbench.cli_help import usage_help

    if usage_help(
        args,
        "bench.tools.calibrate",
        "Measure this GPU at a model's shapes and write its hardware profile (needs CUDA).",
        tool_options={
            "budget_s=S": f"seconds for all microbenchmarks (default {DEFAULT_BUDGET_S:g})",
            "out=FILE": "where the profile goes (default: the user's profile folder, bench.tools.perfmodel.hwprofile)",
            "slice=megatron|bridge": "also run a short bench.run of the config and record its step time",
        },
        examples=("model=qwen3_8b hardware=h100",),
    ):
        return 0
    return entry.run(lambda: _main(args))  # one line and exit 2 on a user or config error


def _main(args: list[str]) -> int:
    import torch

    import muonbench
    from bench import memory
    from bench.tools.perfmodel import hwprofile

    cli, overrides = parse_cli(args)
    cfg = muonbench.load(overrides)
    if cfg.optimizer.name != "muon":  # the NS plan at the model's Muon shapes, with Muon's defaults
        cfg = muonbench.load([o for o in overrides if not o.startswith("optimizer=")] + ["optimizer=muon"])
    if not torch.cuda.is_available():
        raise ValueError("muonbench calibrate measures a GPU: no CUDA device here")
    gpu = gpu_facts()
    if not memory.matches_gpu(cfg.hardware.name, gpu["name"]):
        raise ValueError(f"hardware={cfg.hardware.name}: this GPU is {gpu['name']!r}; pass its group (conf/hardware/)")
    measured = measure(cfg, workload(cfg), cli["budget_s"])
    if "slice" in cli:
        measured["slice"] = run_slice(overrides, cli["slice"], Path("runs", "calibrate", slug(gpu["name"])))
    doc = profile_doc(
        hardware=cfg.hardware.name,
        gpu=gpu,
        measured=measured,
        model=cfg.model.name,
        command=" ".join(["muonbench calibrate", *args]),
        date=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    out = Path(cli.get("out") or hwprofile.user_dir() / f"{doc['name']}.json")
    hwprofile.parse(doc, out)  # what calibrate writes, project reads
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    hwprofile.clear()
    t = doc["tflops"]
    print(
        f"{out}: {gpu['name']} ({cfg.hardware.name}) in {measured['seconds']:.0f} s: dense {t.get('dense', 0):.0f}, "
        f"grouped {t.get('grouped', 0):.0f}, attention {t.get('attention', 0):.0f} TF/s; HBM copy "
        f"{doc['hbm_gbps']['copy']:.0f} GB/s, fused AdamW {doc['hbm_gbps']['adamw']:.0f} GB/s; "
        f"{len(doc['ns_plan_ms'])} NS plan shapes; {len(measured['skipped'])} shapes skipped (budget)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(entry.run(main))
