"""Recommended Muon settings for a model, layout and hardware, priced by the performance model:
`python -m bench.tools.recommend` (`make recommend ARGS=...`).

    python -m bench.tools.recommend model=qwen3_30b_a3b parallelism=dp8_ep8 hardware=h200 [out=DIR] [format=json]

Everything except the CLI-only keys `out` and `format` is a Hydra override composed by `muonbench.load` (the
optimizer is Muon; `engine` defaults to megatron, the engine that runs model parallelism). The search prices, with
`bench.tools.perfmodel` (profile `ours`), every combination of the settings the cost model sees: the TP
Newton-Schulz mode (where TP or expert-TP > 1), the layer-wise assignment and split gate / up. The settings it does
not price keep the product's defaults, each with its reason (coefficient set and steps, NS precision, Gram-NS, split
QKV) or follow the engine's rule (NS overlap). Every candidate is validated as `bench.run` validates it and only
runnable ones are priced; the winner is composed again from its overrides through `muonbench.load`, checked by
`muonbench.check_runnable` (and the Bridge plan for engine=bridge), and its optimizer config objects are built.

Prints the set with one reason per choice, the predicted step time and Muon/AdamW model-only ratio (AdamW step time
over Muon's: the ratio of model TFLOP/s per GPU), the optimizer step seconds per GPU, the memory of weights,
gradients and optimizer state per GPU, and writes `scaling.csv` / `scaling.png` (the ratio over data-parallel sizes
8 to 1024) and `recommendation.json` into `out` (default runs/recommend/<model>_<parallelism>_<hardware>).
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from bench.tools import project
from muonbench.schema import RootConfig
from optim.configs import TP_MODE_CHOICES
from optim.distributed.assignment import Strategy

CLI_KEYS = ("out", "format")
PROFILE = "ours"
DP_SIZES = tuple(2**k for k in range(3, 11))
"""Data-parallel sizes of the scaling curve: 8 to 1024."""
SEARCHED_TP_MODES = TP_MODE_CHOICES
SEARCHED_ASSIGNMENTS = tuple(Strategy)
SEARCHED = ("tp_mode", "assignment", "split_gate_up")
"""The settings the cost model prices, searched jointly."""


def split_args(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """CLI-only keys (out, format) and the Hydra overrides; optimizer=muon and engine=megatron unless given."""
    cli, overrides = project.split_args(argv, CLI_KEYS)
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key == "optimizer" and value != "muon":
            raise ValueError(f"optimizer={value!r}: the recommendation is for Muon; allowed ['muon']")
    if not any(a.startswith("optimizer=") for a in overrides):
        overrides.insert(0, "optimizer=muon")
    if not any(a.startswith("engine=") for a in overrides):
        overrides.insert(0, "engine=megatron")
    return cli, overrides


def _with(
    root: RootConfig, *, dist: dict[str, Any] | None = None, opt: dict[str, Any] | None = None
) -> RootConfig:
    par = root.parallelism
    if dist:
        par = dataclasses.replace(par, distribution=dataclasses.replace(par.distribution, **dist))
    optimizer = dataclasses.replace(root.optimizer, **opt) if opt else root.optimizer
    return dataclasses.replace(root, parallelism=par, optimizer=optimizer)


def runnable(root: RootConfig) -> str | None:
    """None when the product runs `root` (validated as bench.run does, optimizer configs built), else why not."""
    import muonbench
    from muonbench.schema import optim_configs

    try:
        muonbench.validate(root)
        muonbench.check_runnable(root)
        optim_configs(root.optimizer)
        if root.engine.name == "bridge":
            from recipes.overrides import build_plan

            build_plan(root)
    except ValueError as exc:
        return str(exc)
    return None


def _fixed_choices(root: RootConfig) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """(optimizer fields, distribution fields, reason per field) of the settings the cost model does not price."""
    opt, par = root.optimizer, root.parallelism
    reasons = {
        "coefficient_type": f"{opt.coefficient_type} (default): the step count below is what this set is tuned "
        "for; its cost is the same as any set's",
        "num_ns_steps": f"{opt.num_ns_steps} (default): NS cost grows linearly with steps; fewer leave singular "
        "values off 1 (quality is not in the cost model)",
        "ns_precision": f"{opt.ns_precision} (default): the measured NS kernels the cost model reads iterate in it",
        "use_gram_ns": f"{opt.use_gram_ns} (default): the NS plan picks Gram-NS per shape where measured faster "
        "(docs/ns_kernels_h200.md); the cost model prices that pick",
        "split_qkv": f"{opt.split_qkv} (default): Q, K and V orthogonalized apart, as the cost model prices them",
    }
    overlap_ok = root.engine.name == "megatron" and opt.implementation == "ours" and par.dp * par.cp == 1
    reasons["ns_overlap"] = (
        "True: engine=megatron at DP x CP = 1 starts each layer's NS inside the last backward"
        if overlap_ok
        else f"False: NS overlap runs on engine=megatron at DP x CP = 1 only (engine={root.engine.name}, "
        f"DP x CP = {par.dp * par.cp})"
    )
    fixed_opt = {
        "coefficient_type": opt.coefficient_type,
        "num_ns_steps": opt.num_ns_steps,
        "ns_precision": opt.ns_precision,
        "use_gram_ns": opt.use_gram_ns,
        "split_qkv": opt.split_qkv,
        "ns_overlap": overlap_ok,
    }
    return fixed_opt, {}, reasons


def search(root: RootConfig) -> dict[str, Any]:
    """Price every runnable candidate: the fastest one, its reasons, and each candidate's time (or why it cannot
    run)."""
    from bench.tools.perfmodel.model import predict

    par, model = root.parallelism, root.model
    sharded = par.tp > 1 or (model.num_experts and par.etp > 1)
    tp_modes = SEARCHED_TP_MODES if sharded else (root.parallelism.distribution.tp_mode,)
    split_gate_up = (False, True) if model.gated_linear_unit else (False,)
    fixed_opt, _, reasons = _fixed_choices(root)
    tried: list[dict[str, Any]] = []
    for tp_mode, assignment, sgu in itertools.product(tp_modes, SEARCHED_ASSIGNMENTS, split_gate_up):
        dist = {"tp_mode": tp_mode, "assignment": assignment}
        opt = {**fixed_opt, "split_gate_up": sgu}
        cand = _with(root, dist=dist, opt=opt)
        why_not = runnable(cand)
        row: dict[str, Any] = {**dist, "split_gate_up": sgu, "runnable": why_not is None, "why_not": why_not}
        if why_not is None:
            pred = predict(cand, PROFILE)
            row |= {"step_time_s": pred.step_time_s, "optimizer_step_s": pred.breakdown["optimizer_step"]}
        tried.append(row)
    ok = [r for r in tried if r["runnable"]]
    if not ok:
        raise ValueError(f"no runnable Muon setting for this config; first reason: {tried[0]['why_not']}")
    # ties (within 1e-6 relative) go to the product's defaults: no change without a predicted gain
    fastest = min(r["step_time_s"] for r in ok)
    default = (par.distribution.tp_mode, par.distribution.assignment, root.optimizer.split_gate_up)
    best = min(
        (r for r in ok if r["step_time_s"] <= fastest * (1 + 1e-6)),
        key=lambda r: sum(r[k] != d for k, d in zip(SEARCHED, default, strict=True)),
    )

    def alt(**change: Any) -> float | None:
        rows = [r for r in ok if all(r[k] == change.get(k, best[k]) for k in SEARCHED)]
        return rows[0]["optimizer_step_s"] if rows else None

    def vs(field: str, options: tuple[Any, ...]) -> str:
        others = [
            f"{o}: {alt(**{field: o}):.4f} s" for o in options if o != best[field] and alt(**{field: o})
        ]
        return f"optimizer step {best['optimizer_step_s']:.4f} s" + (
            f" (vs {', '.join(others)})" if others else ""
        )

    reasons["tp_mode"] = (
        f"{best['tp_mode']}: " + vs("tp_mode", tp_modes)
        if sharded
        else f"{best['tp_mode']}: moot, TP = expert-TP = 1 (every matrix whole on its rank)"
    )
    reasons["assignment"] = f"{best['assignment']}: " + vs("assignment", SEARCHED_ASSIGNMENTS)
    reasons["split_gate_up"] = (
        f"{best['split_gate_up']}: " + vs("split_gate_up", split_gate_up)
        if model.gated_linear_unit
        else "False: no gated MLP"
    )
    settings_opt = {**fixed_opt, "split_gate_up": best["split_gate_up"]}
    settings_dist = {"tp_mode": best["tp_mode"], "assignment": best["assignment"]}
    return {"optimizer": settings_opt, "distribution": settings_dist, "reasons": reasons, "candidates": tried}


def overrides_of(found: dict[str, Any]) -> list[str]:
    """The Hydra overrides that select the recommended settings."""
    out = [
        f"optimizer.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in found["optimizer"].items()
    ]
    return out + [f"parallelism.distribution.{k}={v}" for k, v in found["distribution"].items()]


def build_checked(overrides: list[str]) -> RootConfig:
    """Compose the recommended config through `muonbench.load` and check the product runs it.

    Raises:
        ValueError: the composed config is not runnable (a bug of the search: it only picks runnable settings).
    """
    import muonbench

    root = muonbench.load(overrides)
    why_not = runnable(root)
    if why_not:
        raise ValueError(f"recommended settings do not build: {why_not}")
    return root


def _scaled(root: RootConfig, dp: int) -> RootConfig | None:
    """`root` at data-parallel size `dp`: tokens per DP rank kept, EP halved until it fits; None if it cannot."""
    par, model = root.parallelism, root.model
    world = dp * par.tp * par.pp * par.cp
    ep = par.ep
    while ep > 1 and (ep * par.etp > dp * par.tp * par.cp or (model.num_experts and model.num_experts % ep)):
        ep //= 2
    gpn = par.gpus_per_node if world % par.gpus_per_node == 0 else world
    scaled = dataclasses.replace(
        par,
        world_size=world,
        ep=ep,
        gbs=max(par.gbs * dp // par.dp, dp * par.mbs),
        nodes=world // gpn,
        gpus_per_node=gpn,
        name=f"{par.name}@dp{dp}",
    )
    out = dataclasses.replace(root, parallelism=scaled)
    import muonbench

    try:
        muonbench.validate(out)
    except ValueError:
        return None
    return out


def scaling(muon: RootConfig, adamw: RootConfig) -> list[dict[str, Any]]:
    """Muon/AdamW model-only ratio over `DP_SIZES` (same layout otherwise)."""
    from bench.tools.perfmodel.model import predict

    rows = []
    for dp in DP_SIZES:
        m, a = _scaled(muon, dp), _scaled(adamw, dp)
        if m is None or a is None:
            continue
        pm, pa = predict(m, PROFILE), predict(a, PROFILE)
        rows.append(
            {
                "dp": dp,
                "world_size": m.parallelism.world_size,
                "ep": m.parallelism.ep,
                "gbs": m.parallelism.gbs,
                "muon_step_s": pm.step_time_s,
                "adamw_step_s": pa.step_time_s,
                "ratio": pa.step_time_s / pm.step_time_s,
                "muon_optimizer_step_s": pm.breakdown["optimizer_step"],
            }
        )
    return rows


def write_outputs(out: Path, result: dict[str, Any]) -> list[Path]:
    """scaling.csv, scaling.png and recommendation.json under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    rows = result["scaling"]
    csv_path, png_path, json_path = out / "scaling.csv", out / "scaling.png", out / "recommendation.json"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["dp"] for r in rows], [r["ratio"] for r in rows], marker="o")
    ax.set_xscale("log", base=2)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("data-parallel size")
    ax.set_ylabel("Muon / AdamW (model TFLOP/s per GPU)")
    c = result["config"]
    ax.set_title(f"{c['model']}, {c['hardware']}, TP{c['tp']} PP{c['pp']} (predicted)", fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    json_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return [csv_path, png_path, json_path]


def recommend(overrides: list[str]) -> dict[str, Any]:
    """The recommendation of one composed config as a plain dict (what `format=json` prints)."""
    import muonbench
    from bench.tools.perfmodel.model import predict

    base = muonbench.load(overrides)
    found = search(base)
    chosen = [*overrides, *overrides_of(found)]
    muon = build_checked(chosen)
    adamw = muonbench.load([o for o in overrides if not o.startswith("optimizer=")] + ["optimizer=adamw"])
    pm, pa = predict(muon, PROFILE), predict(adamw, PROFILE)
    par = muon.parallelism
    return {
        "config": {
            "model": muon.model.name,
            "parallelism": par.name,
            "hardware": muon.hardware.name,
            "precision": muon.precision.name,
            "engine": muon.engine.name,
            "world_size": par.world_size,
            "tp": par.tp,
            "pp": par.pp,
            "dp": par.dp,
            "ep": par.ep,
        },
        "settings": {**found["optimizer"], **found["distribution"]},
        "reasons": found["reasons"],
        "overrides": overrides_of(found),
        "muon_step_s": pm.step_time_s,
        "adamw_step_s": pa.step_time_s,
        "ratio": pa.step_time_s / pm.step_time_s,
        "optimizer_step_s_per_gpu": pm.breakdown["optimizer_step"],
        "adamw_optimizer_step_s_per_gpu": pa.breakdown["optimizer_step"],
        "state_memory_gib_per_gpu": pm.info["state_memory_gib"],
        "adamw_state_memory_gib_per_gpu": pa.info["state_memory_gib"],
        "memory_gib": muon.hardware.memory_gib,
        "candidates": found["candidates"],
        "scaling": scaling(muon, adamw),
    }


def format_text(res: dict[str, Any], written: list[Path]) -> str:
    c = res["config"]
    lines = [
        f"{c['model']} on {c['world_size']} x {c['hardware']} ({c['parallelism']}: TP{c['tp']} PP{c['pp']} "
        f"DP{c['dp']} EP{c['ep']}, {c['precision']}, engine={c['engine']}): recommended Muon settings",
    ]
    lines += [f"  {k:<16} {res['reasons'][k]}" for k in res["settings"]]
    lines += [
        f"  overrides: {' '.join(res['overrides'])}",
        f"  predicted step time   Muon {res['muon_step_s']:.3f} s, AdamW {res['adamw_step_s']:.3f} s; "
        f"Muon/AdamW model-only ratio {res['ratio']:.3f}",
        f"  optimizer step / GPU  Muon {res['optimizer_step_s_per_gpu']:.4f} s (NS + update), "
        f"AdamW {res['adamw_optimizer_step_s_per_gpu']:.4f} s",
        f"  weights + grads + optimizer state / GPU  Muon {res['state_memory_gib_per_gpu']:.1f} GiB, "
        f"AdamW {res['adamw_state_memory_gib_per_gpu']:.1f} GiB (of {res['memory_gib']:.0f}; "
        "activations not counted)",
        "  ratio over data-parallel size: "
        + ", ".join(f"DP{r['dp']} {r['ratio']:.3f}" for r in res["scaling"]),
        "  written: " + ", ".join(str(p) for p in written),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        from muonbench.cli_help import usage

        print(
            usage(
                "bench.tools.recommend",
                "Recommended Muon settings for a model, layout and hardware, with their predicted cost.",
                tool_options={
                    "out=DIR": "where scaling.csv, scaling.png and recommendation.json go "
                    "(default runs/recommend/<model>_<parallelism>_<hardware>)",
                    "format=text|json": "output format (default text)",
                },
                examples=("model=qwen3_30b_a3b parallelism=dp8_ep8 hardware=h200",),
            )
        )
        return 0
    try:
        cli, overrides = split_args(args)
        res = recommend(overrides)
    except ValueError as exc:  # user and config errors: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    c = res["config"]
    out = Path(cli.get("out") or f"runs/recommend/{c['model']}_{c['parallelism']}_{c['hardware']}")
    written = write_outputs(out, res)
    text = json.dumps(res, indent=1, default=str) if cli.get("format") == "json" else format_text(res, written)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
