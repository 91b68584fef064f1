"""Strong scaling of the layer-wise distributed optimizer step alone (Muon on Qwen3-30B-A3B layers).

Usage (one process, or N under torchrun; NCCL on GPUs, gloo on CPU):

    python -m bench.tools.optim_scaling [model=qwen3_30b_a3b] [layers=1] [steps=10] [warmup=2]
        [strategies=lpt_cost,round_robin,ping_pong_numel] [out=DIR] [format=text|json] [scale=1.0]
        [grad_sync=reduce_scatter|all_reduce] [experts=separate|stacked] [qkv=split|fused]
        [ns_precision=bf16|fp32]
    torchrun --nproc_per_node=N -m bench.tools.optim_scaling ...
    python -m bench.tools.optim_scaling summarize=DIR/scaling.jsonl   # markdown speedup table over world sizes

Parameters: the optimizer-managed matrices of `layers` MoE decoder layers of `model`, shapes from
`bench.flops.enumerate_ns_matrices(model, split_qkv=False)`, named and laid out as the Megatron adapter
(`optim.megatron`) sees them: the fused `linear_qkv` weight with its per-query-group Q/K/V row split (MCore
`_get_qkv_split_shapes`; `qkv=fused` orthogonalizes it whole), `linear_proj`, the router, and the routed
experts as separate 2-D `linear_fc1.weight<k>` / `linear_fc2.weight<k>` (TE grouped GEMM naming;
`experts=stacked`: one (E, rows, cols) stack per layer, HF style). fp32 parameters (Megatron's fp32 masters)
with fixed random gradients. Every rank holds the whole layer (expert-DP = DP = all ranks), so N ranks split
the same optimizer work: strong scaling. `scale` multiplies every dimension (rows, cols, head dim; expert
count kept) for CPU runs.

Per strategy: `optim.Muon` (EO defaults; bf16 NS uses `optim.kernels` on CUDA) wrapped in
`optim.distributed.layerwise.LayerWiseDistributedOptimizer` (reduce-scatter grad path, overlap off, default
buckets). Protocol: `warmup` steps (NS plan measurement, allocator warm-up) then `steps` timed steps; ranks
are barrier-aligned before each step; phases timed with CUDA events (`bench.timing.PhaseTimer`, wall clock on
CPU):

- `step_ms`: the whole `step()`; per rank the median over steps, reported as the max over ranks (the step ends
  when the slowest rank ends) with `step_iqr_ms` of that rank.
- `ns_ms`: the matrix optimizer's orthogonalize calls (Newton-Schulz) on each rank: `ns_max_ms`, `ns_mean_ms`,
  `ns_imbalance` = max / mean over ranks (measured), next to `model_ns_imbalance` from the cost model of
  `optim.distributed.assignment`.
- `grad_sync_ms` (reduce-scatter to owners) and `param_gather_ms` (all-gather of updated parameters, launch
  plus wait plus copy-out) on the rank with the largest step; the gather wait includes waiting for the slowest
  owner.
- `other_ms`: median over steps of step - ns - grad_sync - param_gather on that rank (momentum, scaling,
  packing, copies). Each phase is a median on its own, so the columns need not add up to `step_ms` exactly.

Rank 0 appends one JSON object per (world_size, strategy) to `out/scaling.jsonl` and prints a table (text) or
the JSON lines (format=json).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.results import markdown
from bench.results.record import git_info
from bench.timing import PhaseTimer

DEFAULTS = {
    "model": "qwen3_30b_a3b",
    "layers": "1",
    "steps": "10",
    "warmup": "2",
    "strategies": "lpt_cost,round_robin,ping_pong_numel",
    "out": "",
    "format": "text",
    "scale": "1.0",
    "grad_sync": "reduce_scatter",
    "experts": "separate",
    "qkv": "split",
    "ns_precision": "bf16",
    "summarize": "",
}
CHOICES = {
    "format": ("text", "json"),
    "grad_sync": ("reduce_scatter", "all_reduce"),
    "experts": ("separate", "stacked"),
    "qkv": ("split", "fused"),
    "ns_precision": ("bf16", "fp16", "fp32"),
}
STRATEGIES = ("lpt_cost", "round_robin", "ping_pong_numel")
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
PHASES = ("step", "ns", "grad_sync", "param_gather")


def parse_args(argv: list[str]) -> dict[str, Any]:
    """key=value arguments over DEFAULTS; ValueError naming the key, the value and the allowed set."""
    opts: dict[str, Any] = dict(DEFAULTS)
    for a in argv:
        key, sep, value = a.partition("=")
        if not sep or key not in DEFAULTS:
            raise ValueError(f"argument {a!r}: expected key=value with key one of {sorted(DEFAULTS)}")
        opts[key] = value
    for key, allowed in CHOICES.items():
        if opts[key] not in allowed:
            raise ValueError(f"{key}={opts[key]!r}: must be one of {list(allowed)}")
    strategies = [s for s in opts["strategies"].split(",") if s]
    bad = [s for s in strategies if s not in STRATEGIES]
    if bad or not strategies:
        raise ValueError(f"strategies={opts['strategies']!r}: each must be one of {list(STRATEGIES)}")
    opts["strategies"] = strategies
    for key, kind, low in (("layers", int, 1), ("steps", int, 1), ("warmup", int, 0), ("scale", float, 0.0)):
        try:
            opts[key] = kind(opts[key])
        except ValueError:
            raise ValueError(f"{key}={opts[key]!r}: must be a {kind.__name__}") from None
        if opts[key] < low or (key == "scale" and opts[key] <= 0):
            raise ValueError(f"{key}={opts[key]!r}: must be {'> 0' if key == 'scale' else f'>= {low}'}")
    return opts


def layer_params(model: Any, *, layers: int, scale: float, experts: str, qkv: str) -> list[dict[str, Any]]:
    """Specs {name, shape, split} of the optimizer-managed matrices of `layers` MoE layers (else dense)."""
    from types import SimpleNamespace

    from bench.flops import enumerate_ns_matrices
    from optim.megatron import qkv_split

    def dim(x: int) -> int:
        return max(4, round(x * scale))

    moe = model.num_experts > 0 and model.num_layers > model.num_dense_layers
    keep = {"all", "moe" if moe else "dense"}
    d = max(1, round(model.kv_channels * scale)) if model.kv_channels else 0
    specs: list[dict[str, Any]] = []
    for layer in range(layers):
        for m in enumerate_ns_matrices(model, split_qkv=False):
            if m.layer_type not in keep:
                continue
            base = f"decoder.layers.{layer}.{m.name}"
            rows, cols, split = dim(m.rows), dim(m.cols), None
            if m.kind == "attn_qkv":  # rows from the scaled head dim, so the per-group split stays exact
                groups, heads = model.num_query_groups, model.num_attention_heads
                rows = groups * (heads // groups + 2) * d
                cfg = SimpleNamespace(num_attention_heads=heads, num_query_groups=groups, kv_channels=d)
                split = qkv_split(cfg, rows) if qkv == "split" else None
            if m.expert and experts == "separate":
                specs += [
                    {"name": f"{base}.weight{k}", "shape": (rows, cols), "split": None}
                    for k in range(m.per_layer)
                ]
            elif m.per_layer > 1:
                specs.append({"name": f"{base}.weight", "shape": (m.per_layer, rows, cols), "split": None})
            else:
                specs.append({"name": f"{base}.weight", "shape": (rows, cols), "split": split})
    return specs


def _init_dist() -> tuple[Any, Any, int, int]:
    """(device, group, rank, world size); initialises torch.distributed under torchrun (WORLD_SIZE > 1)."""
    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world == 1:
        return device, None, 0, 1
    for key, value in NO_MULTICAST.items():  # NVLink multicast stays off (device README)
        os.environ.setdefault(key, value)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    return device, dist.group.WORLD, dist.get_rank(), dist.get_world_size()


def _sync(device: Any, group: Any) -> None:
    import torch
    import torch.distributed as dist

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if group is not None:
        dist.barrier()


def _gather(obj: Any, group: Any) -> list[Any]:
    import torch.distributed as dist

    if group is None:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def run_strategy(
    specs: list[dict[str, Any]],
    params: list[Any],
    strategy: str,
    opts: dict[str, Any],
    device: Any,
    group: Any,
) -> dict[str, Any]:
    """Build the layer-wise optimizer for `strategy`, time warmup + steps; this rank's phase medians."""
    import torch

    from optim.configs import MuonConfig
    from optim.distributed.assignment import CostModel
    from optim.distributed.layerwise import LayerWiseConfig, LayerWiseDistributedOptimizer
    from optim.optimizers.muon import Muon

    split_of = {s["name"]: s["split"] for s in specs}
    muon_cfg = MuonConfig(ns_precision=opts["ns_precision"])

    def factory(owned: list[tuple[str, torch.Tensor]]) -> torch.optim.Optimizer:
        splits = {t: split_of[n] for n, t in owned if split_of[n] is not None}
        group0 = {"params": [t for _, t in owned], "param_names": [n for n, _ in owned]}
        return Muon([group0], muon_cfg, splits=splits)

    named = [(s["name"], p) for s, p in zip(specs, params, strict=True)]
    cfg = LayerWiseConfig(strategy=strategy, grad_sync=opts["grad_sync"], overlap_param_gather=False)
    opt = LayerWiseDistributedOptimizer(
        named, factory, is_matrix=lambda n, p: True, dp_group=group, config=cfg
    )
    timer = PhaseTimer(cuda=device.type == "cuda")
    if opt.inner is not None:
        opt.inner._orthogonalize = timer.wrap(opt.inner._orthogonalize, "ns")  # type: ignore[method-assign]
    for d in opt.domains:  # the same instrumentation as bench.engines.hf
        d.sync_grads = timer.wrap(d.sync_grads, "grad_sync")
        d.start_gather = timer.wrap(d.start_gather, "param_gather")
        d.finish_gather = timer.wrap(d.finish_gather, "param_gather")
    per_step: list[dict[str, float]] = []
    for i in range(opts["warmup"] + opts["steps"]):
        _sync(device, group)
        timer.reset()
        with timer.phase("step"):
            opt.step()
        phases = timer.collect()
        if i >= opts["warmup"]:
            ms = {k: 1e3 * phases.get(k, 0.0) for k in PHASES}
            ms["other"] = ms["step"] - ms["ns"] - ms["grad_sync"] - ms["param_gather"]
            per_step.append(ms)
    steps_ms = [s["step"] for s in per_step]
    q = statistics.quantiles(steps_ms, n=4) if len(steps_ms) > 1 else [steps_ms[0]] * 3
    mine = {k: statistics.median(s[k] for s in per_step) for k in (*PHASES, "other")}
    mine["step_iqr"] = q[2] - q[0]
    mine["model_ns_ms"] = sum(d.ns_load_ms(cfg.cost_model or CostModel()) for d in opt.domains)
    mine["owned_numel"] = sum(view.numel() for *_, view in opt.owned())
    mine["buffer_numel"] = sum(b.segment_numel * d.size for d in opt.domains for b in d.buckets)
    mine["num_buckets"] = sum(len(d.buckets) for d in opt.domains)
    del opt, timer
    gc.collect()  # timing wrappers hold bound methods: cycles keep the buffers alive until collected
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return mine


def summarize(
    ranks: list[dict[str, Any]],
    *,
    world: int,
    strategy: str,
    opts: dict[str, Any],
    specs: list[dict[str, Any]],
    meta: dict[str, Any],
) -> dict[str, Any]:
    """One row from every rank's phase medians (see the module docstring for the definitions)."""
    slow = max(ranks, key=lambda r: r["step"])
    ns = [r["ns"] for r in ranks]
    model_ns = [r["model_ns_ms"] for r in ranks]
    owned = [r["owned_numel"] for r in ranks]
    numel = sum(_numel(s["shape"]) for s in specs)
    elem = 4  # fp32 masters and gradients
    ring = (world - 1) / world if world > 1 else 0.0
    buf = slow["buffer_numel"]
    return {
        "world_size": world,
        "strategy": strategy,
        "model": opts["model"],
        "layers": opts["layers"],
        "scale": opts["scale"],
        "experts": opts["experts"],
        "qkv": opts["qkv"],
        "grad_sync": opts["grad_sync"],
        "ns_precision": opts["ns_precision"],
        "overlap_param_gather": False,
        "num_params": len(specs),
        "numel": numel,
        "steps": opts["steps"],
        "warmup": opts["warmup"],
        "step_ms": slow["step"],
        "step_iqr_ms": slow["step_iqr"],
        "ns_max_ms": max(ns),
        "ns_mean_ms": statistics.fmean(ns),
        "ns_imbalance": max(ns) / statistics.fmean(ns) if statistics.fmean(ns) > 0 else None,
        "model_ns_imbalance": (
            max(model_ns) / statistics.fmean(model_ns) if statistics.fmean(model_ns) > 0 else None
        ),
        "grad_sync_ms": slow["grad_sync"],
        "param_gather_ms": slow["param_gather"],
        "other_ms": slow["other"],
        "owned_numel_max": max(owned),
        "owned_imbalance": max(owned) / statistics.fmean(owned),
        "num_buckets": slow["num_buckets"],
        # ring model: reduce-scatter (all_reduce: twice) plus all-gather of the padded buffers, bytes per rank
        "comm_bytes_per_rank": int(ring * buf * elem * (3 if opts["grad_sync"] == "all_reduce" else 2)),
        "rank_step_ms": [r["step"] for r in ranks],
        "rank_ns_ms": ns,
        **meta,
    }


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def _meta(device: Any, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    nccl = None
    if device.type == "cuda":
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return {
        "device": device.type,
        "gpu": gpu,
        "backend": dist.get_backend() if world > 1 else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "git": git_info(),
        "command": " ".join(sys.argv),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def table(rows: list[dict[str, Any]]) -> str:
    """Plain-text table of the rows (one per strategy)."""
    cols = (
        "world_size",
        "strategy",
        "step_ms",
        "step_iqr_ms",
        "ns_max_ms",
        "ns_mean_ms",
        "ns_imbalance",
        "model_ns_imbalance",
        "grad_sync_ms",
        "param_gather_ms",
        "other_ms",
    )
    return markdown.table(cols, [[f"{r[c]:.2f}" if isinstance(r[c], float) else r[c] for c in cols] for r in rows])


def scaling_summary(rows: list[dict[str, Any]]) -> str:
    """Markdown strong-scaling table: per (strategy, grad_sync) and world size, step time, speedup and
    parallel efficiency against the strategy's world-size-1 row (the last row of a key wins: files are
    appended)."""
    last: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in rows:
        last[(r["strategy"], r["grad_sync"], r["world_size"])] = r
    header = (
        "| strategy | grad_sync | GPUs | step ms | speedup | efficiency | NS max ms | NS imbalance | "
        "grad sync ms | param gather ms | other ms |"
    )
    lines = [header, "|" + "---|" * 11]
    for (strategy, grad_sync, world), r in sorted(last.items()):
        # one rank moves nothing, so any grad path's world-size-1 row of the strategy is the baseline
        base = last.get((strategy, grad_sync, 1)) or next(
            (v for (st, _, w), v in last.items() if st == strategy and w == 1), None
        )
        speedup = base["step_ms"] / r["step_ms"] if base else None
        eff = f"{speedup / world:.2f}" if speedup else "n/a"
        lines.append(
            f"| {strategy} | {grad_sync} | {world} | {r['step_ms']:.2f} | "
            f"{f'{speedup:.2f}' if speedup else 'n/a'} | {eff} | {r['ns_max_ms']:.2f} | "
            f"{r['ns_imbalance']:.3f} | {r['grad_sync_ms']:.2f} | {r['param_gather_ms']:.2f} | "
            f"{r['other_ms']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from muonbench.cli_help import module_help

    if module_help(__doc__, list(sys.argv[1:] if argv is None else argv)):
        return 0
    opts = parse_args(list(sys.argv[1:] if argv is None else argv))
    if opts["summarize"]:  # tabulate an existing scaling.jsonl; no torch needed
        rows = [json.loads(line) for line in Path(opts["summarize"]).read_text().splitlines() if line.strip()]
        print(scaling_summary(rows))
        return 0
    import torch

    from muonbench import load

    model = load([f"model={opts['model']}"]).model
    device, group, rank, world = _init_dist()
    specs = layer_params(
        model, layers=opts["layers"], scale=opts["scale"], experts=opts["experts"], qkv=opts["qkv"]
    )
    gen = torch.Generator(device=device).manual_seed(1234)  # same values on every rank
    params = [torch.nn.Parameter(torch.randn(s["shape"], generator=gen, device=device) * 0.02) for s in specs]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen, device=device) * 1e-3
    meta = _meta(device, world)
    rows = []
    for strategy in opts["strategies"]:
        mine = run_strategy(specs, params, strategy, opts, device, group)
        everyone = _gather(mine, group)
        rows.append(summarize(everyone, world=world, strategy=strategy, opts=opts, specs=specs, meta=meta))
    if rank == 0:
        if opts["out"]:
            out = Path(opts["out"])
            out.mkdir(parents=True, exist_ok=True)
            with open(out / "scaling.jsonl", "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        print("\n".join(json.dumps(r) for r in rows) if opts["format"] == "json" else table(rows), flush=True)
    if group is not None:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from bench import entry

    raise SystemExit(entry.run(main))
