"""Time one optimizer step over a Qwen3-30B-A3B-layer-shaped parameter set: optim.Muon vs AdamW vs EO Muon.

Usage: `python -m bench.tools.optim_step [device=cpu|cuda] [format=md|json] [scale=F] [repeats=N] [warmup=N]
[threads=N] [impls=a,b,...] [layout=separate|buckets]`.

Parameters are one Qwen3-30B-A3B layer as separate fp32 matrices (q 4096x2048, k and v 512x2048, o 2048x4096,
128 experts of fc1 1536x2048 (gate and up fused) and fc2 2048x768), 260 parameters, with fixed random
gradients. On CPU each dimension is multiplied by `scale` (default 1/16, experts kept at 128 so the
per-parameter work is represented); on CUDA the default scale is 1 (full shapes). `layout=buckets` lays the
matrices out as optim.distributed's layer-wise optimizer holds a rank's owned matrices: views of flat fp32 buffers
of at most `LayerWiseConfig.bucket_numel` (40 M) elements, consecutive in model order (the fused Muon step then
writes each expert bucket's update from its last NS product, `optim.optimizers.fused._fold_targets`); `separate`
(the default): one allocation per matrix, as a module's own parameters. Implementations:

- `adamw_foreach`: torch.optim.AdamW(foreach=True), the memory-bound reference.
- `optim_muon`: optim.Muon (EO v0.3.0 defaults, lr 1e-4; on CUDA its fused step path, `MuonConfig.fused_step`).
- `optim_muon_split`: the same with each expert fc1 orthogonalized as its gate and up halves apart (768 x 2048
  each at scale 1; `MuonConfig.split_gate_up` in a Megatron run).
- `optim_muon_fp16`: optim.Muon with `ns_precision="fp16"` (the fp16 iterate of the Megatron slice recipes).
- `optim_muon_vouched`: optim.Muon told before each step that the gradients are finite (`assume_finite_grads`),
  as the Megatron wrapper does after its global gradient-norm check: no gradient screen.
- `optim_muon_no_ns`: optim.Muon with its orthogonalization replaced by the identity: everything of the step
  except Newton-Schulz (momentum, finite check, stacking, scaling, weight decay, update).
- `optim_muon_unfused`, `optim_muon_unfused_no_ns`: the same with `fused_step=False` (the multi-tensor torch path;
  on CPU `fused_step` has no effect, the fused path needs CUDA, so both pairs time the same code there).
- `optim_mop_pe`: optim.MOP with polar_method="polar_express".
- `eo_muon`: emerging-optimizers 0.3.0 Muon (when installed; loops over parameters).

Protocol: `warmup` untimed steps (default 1), then `repeats` timed steps (CUDA: synchronized around each step),
median and IQR of the wall time in ms, and the median process CPU time (the steadier number on a shared CPU; on CUDA
it only shows host work and sync waits). Each step is a real update (parameters move), which does not change the
work done. On an H200 the step runs at the GPU's power cap: the first steps after an idle GPU are ~10% faster than
the steps after them (docs/ns_kernels_h200.md). Every step's time is in the JSON output;
`warmup=20` times the capped steady state alone.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

IMPLS = (
    "adamw_foreach",
    "optim_muon",
    "optim_muon_split",
    "optim_muon_fp16",
    "optim_muon_vouched",
    "optim_muon_no_ns",
    "optim_muon_unfused",
    "optim_muon_unfused_no_ns",
    "optim_mop_pe",
    "eo_muon",
)


def layer_shapes(scale: float) -> list[tuple[int, int, int]]:
    """(rows, cols, count) of the layer with rows and cols multiplied by scale (at least 4)."""
    from bench.tools.ns_kernels_measure import (
        LAYERS,  # the kernel benchmark's layer, so both time the same shapes
    )

    return [
        (max(4, round(r * scale)), max(4, round(c * scale)), n) for r, c, n in LAYERS["qwen3_30b_a3b_layer"]
    ]


def _factories(device: str, scale: float) -> dict[str, Callable[[list[Any]], Any]]:
    import torch

    from bench.tools.ns_kernels_measure import FC1
    from optim import MOP, Muon, MuonConfig
    from optim.configs import MOPConfig
    from optim.functional.split import RowSplit

    fc1 = tuple(max(4, round(d * scale)) for d in FC1["qwen3_30b_a3b_layer"])
    halves = RowSplit(num_groups=1, sizes=(fc1[0] // 2, fc1[0] - fc1[0] // 2), labels=("gate", "up"))

    def no_ns(ps: list[Any], fused: bool = True) -> Any:
        opt = Muon(ps, MuonConfig(lr=1e-4, fused_step=fused))
        opt._orthogonalize = lambda x: (x, None)
        opt._ns_deferred = lambda x, sumsq: None  # no NS whose last product writes the update either
        return opt

    def vouched(ps: list[Any]) -> Any:
        opt = Muon(ps, MuonConfig(lr=1e-4))
        step = opt.step

        def vouched_step(closure: Any = None) -> Any:
            opt.assume_finite_grads()
            return step(closure)

        opt.step = vouched_step  # type: ignore[method-assign]
        return opt

    out: dict[str, Callable[[list[Any]], Any]] = {
        "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-4, foreach=True),
        "optim_muon": lambda ps: Muon(ps, MuonConfig(lr=1e-4)),
        "optim_muon_split": lambda ps: Muon(
            ps, MuonConfig(lr=1e-4), splits={p: halves for p in ps if tuple(p.shape) == fc1}
        ),
        "optim_muon_fp16": lambda ps: Muon(ps, MuonConfig(lr=1e-4, ns_precision="fp16")),
        "optim_muon_vouched": vouched,
        "optim_muon_no_ns": no_ns,
        "optim_muon_unfused": lambda ps: Muon(ps, MuonConfig(lr=1e-4, fused_step=False)),
        "optim_muon_unfused_no_ns": lambda ps: no_ns(ps, fused=False),
        "optim_mop_pe": lambda ps: MOP(ps, MOPConfig(lr=1e-4, polar_method="polar_express")),
    }
    try:
        from emerging_optimizers.orthogonalized_optimizers import Muon as EOMuon

        out["eo_muon"] = lambda ps: EOMuon(ps, lr=1e-4)
    except ImportError:
        pass
    return out


LAYOUTS = ("separate", "buckets")


def lay_out(ps: list[Any], layout: str, bucket_numel: int | None = None) -> list[Any]:
    """The parameters (with their gradients) in `layout` (see the module docstring); the same values. Buffers of
    at most `bucket_numel` elements (default: `LayerWiseConfig.bucket_numel`)."""
    import torch

    from optim.distributed.layerwise import LayerWiseConfig

    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}")
    if layout == "separate" or not ps:
        return ps
    limit = LayerWiseConfig().bucket_numel if bucket_numel is None else bucket_numel
    groups: list[list[Any]] = [[]]
    for p in ps:
        if groups[-1] and sum(q.numel() for q in groups[-1]) + p.numel() > limit:
            groups.append([])
        groups[-1].append(p)
    out = []
    for group in groups:
        flat = torch.empty(sum(p.numel() for p in group), dtype=group[0].dtype, device=group[0].device)
        at = 0
        for p in group:
            view = flat[at : at + p.numel()].view(p.shape)
            view.copy_(p.detach())
            q = torch.nn.Parameter(view)
            q.grad = p.grad
            out.append(q)
            at += p.numel()
    return out


def time_step(opt: Any, device: str, repeats: int, warmup: int = 1) -> tuple[list[float], list[float]]:
    """(wall ms, process CPU ms) of `repeats` steps after `warmup` untimed steps (CUDA synchronized around each).

    On a shared CPU the process CPU time is the steadier number (time spent preempted is not counted); it sums
    over intra-op threads, so compare it at threads=1.
    """
    import torch

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(warmup):
        opt.step()
    sync()
    wall, cpu = [], []
    for _ in range(repeats):
        sync()
        t, c = time.perf_counter(), time.process_time()
        opt.step()
        sync()
        wall.append((time.perf_counter() - t) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    return wall, cpu


def run(
    *,
    device: str,
    scale: float,
    repeats: int,
    threads: int = 0,
    impls: tuple[str, ...] = IMPLS,
    warmup: int = 1,
    layout: str = "separate",
) -> dict[str, Any]:
    """Measure every implementation; returns a JSON-able dict (config, env, one row per implementation)."""
    import torch

    from bench.tools.ns_kernels_measure import make_params

    if threads > 0:
        torch.set_num_threads(threads)
    spec = layer_shapes(scale)
    res: dict[str, Any] = {
        "layer": "qwen3_30b_a3b",
        "shapes": spec,
        "num_params": sum(n for _, _, n in spec),
        "numel": sum(r * c * n for r, c, n in spec),
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "scale": scale,
        "repeats": repeats,
        "warmup": warmup,
        "layout": layout,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "rows": [],
    }
    for name, make in _factories(device, scale).items():
        if name not in impls:
            continue
        ps = lay_out(make_params(spec, device), layout)
        opt = make(ps)
        ts, cs = time_step(opt, device, repeats, warmup)
        q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0], ts[0], ts[0]]
        res["rows"].append(
            {
                "impl": name,
                "median_ms": statistics.median(ts),
                "iqr_ms": q[2] - q[0],
                "cpu_median_ms": statistics.median(cs),
                "times_ms": ts,
                "cpu_times_ms": cs,
            }
        )
        del opt, ps
        if device == "cuda":
            torch.cuda.empty_cache()
    return res


def to_markdown(res: dict[str, Any]) -> str:
    """The result as a markdown table with its protocol line."""
    head = (
        f"Qwen3-30B-A3B layer optimizer step, device={res['device']} ({res['device_name']}), scale={res['scale']}, "
        f"{res['num_params']} params ({res.get('layout', 'separate')} layout), {res['numel'] / 1e6:.2f} M elements, "
        f"torch {res['torch']}, "
        f"{res['threads']} threads; {res['warmup']} warm-up step(s), median and IQR of {res['repeats']} steps."
    )
    lines = [
        head,
        "",
        "| impl | median ms | IQR ms | median process CPU ms |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['impl']} | {r['median_ms']:.2f} | {r['iqr_ms']:.2f} | {r['cpu_median_ms']:.2f} |"
        for r in res["rows"]
    ]
    return "\n".join(lines)


def _number(args: dict[str, str], key: str, kind: type, default: float) -> Any:
    try:
        return kind(args.get(key, default))
    except ValueError:
        raise ValueError(f"{key}={args[key]!r}: not a {kind.__name__}") from None


def parse_args(argv: list[str]) -> tuple[dict[str, Any], str]:
    """(the keyword arguments of `run`, the output format) from key=value arguments; ValueError names the
    argument, its value and what is allowed."""
    bare = [a for a in argv if "=" not in a]
    if bare:
        raise ValueError(f"{bare}: arguments are key=value (python -m bench.tools.optim_step --help)")
    args = dict(a.split("=", 1) for a in argv)
    allowed = {"device", "format", "scale", "repeats", "warmup", "threads", "impls", "layout"}
    if set(args) - allowed:
        raise ValueError(f"unknown arguments {sorted(set(args) - allowed)}; allowed: {sorted(allowed)}")
    device = args.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not one of ('cpu', 'cuda')")
    fmt = args.get("format", "md")
    if fmt not in ("md", "json"):
        raise ValueError(f"format={fmt!r} is not one of ('md', 'json')")
    impls = tuple(args.get("impls", ",".join(IMPLS)).split(","))
    if set(impls) - set(IMPLS):
        raise ValueError(f"impls={sorted(set(impls) - set(IMPLS))} not among {IMPLS}")
    layout = args.get("layout", "separate")
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}")
    warmup = _number(args, "warmup", int, 1)
    if warmup < 0:
        raise ValueError(f"warmup={warmup}: the number of untimed steps must be >= 0")
    kwargs = {
        "device": device,
        "scale": _number(args, "scale", float, 1.0 if device == "cuda" else 1 / 16),
        "repeats": _number(args, "repeats", int, 10 if device == "cuda" else 5),
        "threads": _number(args, "threads", int, 0),
        "impls": impls,
        "warmup": warmup,
        "layout": layout,
    }
    return kwargs, fmt


def main(argv: list[str] | None = None) -> int:
    """CLI entry: key=value arguments (device, format, scale, repeats, warmup, threads, impls, layout)."""
    from muonbench.cli_help import module_help

    if module_help(__doc__, list(sys.argv[1:] if argv is None else argv)):
        return 0
    try:
        kwargs, fmt = parse_args(list(sys.argv[1:] if argv is None else argv))
    except ValueError as exc:  # user errors: one line naming the argument, the value and the allowed set
        print(f"error: {exc}", file=sys.stderr)
        return 2
    res = run(**kwargs)
    print(json.dumps(res, indent=1) if fmt == "json" else to_markdown(res))
    return 0


if __name__ == "__main__":
    from bench import entry

    raise SystemExit(entry.run(main))
