"""CLI and summary of `bench.flops`: `python -m bench.tools.flops model=... parallelism=... [format=json]`.

Hydra-style overrides compose the config tree (`config.load`); the optimizer group supplies the NS options
(num_ns_steps, split_qkv, split_mla_kv_down, split_gate_up, router_to_matrix, distributed, tp_mode), so e.g.
`optimizer.split_mla_kv_down=true` changes the enumeration. `format=json` (CLI only) prints one JSON object.
"""

from __future__ import annotations

from typing import Any

from bench.flops import (
    NSMatrix,
    model_flops_breakdown,
    model_flops_per_step,
    model_flops_per_token,
    ns_flops_per_step,
    ns_load_per_gpu,
)
from muonbench.schema import ModelConfig, ParallelismConfig
from optim.cost import CONVENTIONS, FORMULAS, ns_flops


def summary(model: ModelConfig, par: ParallelismConfig, **ns_options: Any) -> dict[str, Any]:
    """Everything the CLI prints, as one JSON-ready dict (FLOPs as floats)."""
    load = ns_load_per_gpu(model, par, **ns_options)
    opts = load["options"]
    k, restarts = opts["num_ns_steps"], tuple(opts["restart_iterations"])
    mats: list[NSMatrix] = load["matrices"]
    per_step = {c: ns_flops_per_step(mats, k, c, restart_iterations=restarts) for c in CONVENTIONS}
    model_step = model_flops_per_step(model, par)
    out: dict[str, Any] = {
        "model": model.name,
        "parallelism": par.name,
        "world_size": par.world_size,
        "seq_length": model.seq_length,
        "gbs": par.gbs,
        "tokens_per_step": par.gbs * model.seq_length,
        "model_flops_per_token": model_flops_per_token(model, tp=par.tp),
        "model_flops_per_token_breakdown": model_flops_breakdown(model, tp=par.tp),
        "model_flops_per_step": model_step,
        "model_flops_per_gpu_per_step": model_step / par.world_size,
        "ns_formulas": FORMULAS,
        "ns_options": opts,
    }
    for c in CONVENTIONS:
        sfx = "" if c == "plain" else f"_{c}"
        out[f"ns_flops_per_step{sfx}"] = per_step[c]
        out[f"ns_flops_per_gpu_max{sfx}"] = load["max"][c]
        out[f"ns_flops_per_gpu_mean{sfx}"] = load["mean"][c]
    out["ns_to_model_flops_per_gpu"] = load["max"]["plain"] / (model_step / par.world_size)
    out["ns_max_pp_rank"] = load["max_pp_rank"]
    on_max = load["kinds_on_max_gpu"]
    out["ns_matrices"] = [
        {
            "kind": m.kind,
            "name": m.name,
            "rows": m.rows,
            "cols": m.cols,
            "count": m.count,
            "expert": m.expert,
            "layer_type": m.layer_type,
            "count_on_max_gpu": on_max.get(m.kind, 0),
            **{
                f"flops_each_{c}": ns_flops(m.rows, m.cols, k, c, restart_iterations=restarts)
                for c in CONVENTIONS
            },
            "flops_per_step_plain": m.count * ns_flops(m.rows, m.cols, k, "plain"),
        }
        for m in mats
    ]
    out["ns_stages"] = load["stages"]
    return out


def _print_text(s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    br = s["model_flops_per_token_breakdown"]
    console.print(f"Model FLOPs (Megatron), {s['model']} at seq {s['seq_length']}, {s['parallelism']}")
    t = Table()
    for col in ("term", "GFLOP/token"):
        t.add_column(col, justify="right" if col != "term" else "left")
    for term, v in br.items():
        t.add_row(term, f"{v / 1e9:.4g}")
    t.add_row("total", f"{s['model_flops_per_token'] / 1e9:.4g}")
    console.print(t)
    console.print(
        f"per step (GBS {s['gbs']} x {s['seq_length']} = {s['tokens_per_step']:,} tokens): "
        f"{s['model_flops_per_step']:.4g} FLOP; per GPU ({s['world_size']}): "
        f"{s['model_flops_per_gpu_per_step']:.4g}"
    )
    o = s["ns_options"]
    console.print(
        f"Newton-Schulz matrices (num_ns_steps={o['num_ns_steps']}; split_qkv={o['split_qkv']}"
        f" split_mla_kv_down={o['split_mla_kv_down']} split_gate_up={o['split_gate_up']}"
        f" router_to_matrix={o['router_to_matrix']}); TF = 1e12 FLOP"
    )
    t = Table()
    for col in (
        "kind",
        "shape (out x in)",
        "count",
        "on max GPU",
        "plain TF",
        "syrk TF",
        "gram TF",
        "plain TF/step",
    ):
        t.add_column(col, justify="left" if col == "kind" else "right")
    for m in s["ns_matrices"]:
        t.add_row(
            m["kind"],
            f"{m['rows']}x{m['cols']}",
            f"{m['count']:,}",
            f"{m['count_on_max_gpu']:,}",
            f"{m['flops_each_plain'] / 1e12:.4g}",
            f"{m['flops_each_syrk'] / 1e12:.4g}",
            f"{m['flops_each_gram'] / 1e12:.4g}",
            f"{m['flops_per_step_plain'] / 1e12:.4g}",
        )
    console.print(t)
    console.print(f"NS FLOPs per GPU per step ({o['distributed']}, tp_mode {o['tp_mode']}), by pipeline rank")
    t = Table()
    for col in ("pp rank", "layers (dense/moe)", "max plain", "max syrk", "max gram", "mean plain"):
        t.add_column(col, justify="right")
    for st in s["ns_stages"]:
        t.add_row(
            str(st["pp_rank"]),
            f"{st['layers']} ({st['dense_layers']}/{st['moe_layers']})",
            *(f"{st['max'][c]:.4g}" for c in CONVENTIONS),
            f"{st['mean']['plain']:.4g}",
        )
    console.print(t)
    for c in CONVENTIONS:
        sfx = "" if c == "plain" else f"_{c}"
        console.print(
            f"{c:5s} {FORMULAS[c]}\n      per step {s['ns_flops_per_step' + sfx]:.4g}, per GPU max "
            f"{s['ns_flops_per_gpu_max' + sfx]:.4g}, mean {s['ns_flops_per_gpu_mean' + sfx]:.4g}"
        )
    console.print(f"NS (plain, max GPU) / model FLOPs per GPU: {s['ns_to_model_flops_per_gpu']:.4f}")


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.tools.flops model=... parallelism=... [optimizer.split_mla_kv_down=true ...] [format=json]`."""
    import json
    import sys

    from muonbench import load

    args = list(sys.argv[1:] if argv is None else argv)
    from muonbench.cli_help import usage_help

    if usage_help(
        args,
        "bench.tools.flops",
        "Model FLOPs per token and per step (Megatron formula) and the Newton-Schulz FLOPs of one optimizer\n"
        "step (plain, syrk and Gram-NS counts) of a composed configuration; no GPU, no torch.",
        tool_options={"format=text|json": "output format (default text)"},
        examples=(
            "model=qwen3_30b_a3b parallelism=dp8_ep8 format=json",
            "model=kimi_k2 optimizer.split_mla_kv_down=true",
        ),
    ):
        return 0
    fmt = "text"
    for a in [a for a in args if a.startswith("format=")]:
        fmt = a.split("=", 1)[1]
        args.remove(a)
    try:
        if fmt not in ("text", "json"):
            raise ValueError(f"format={fmt!r}: must be one of ['text', 'json']")
        s = _summary_from(load(args))
    except ValueError as exc:  # config and user errors: one line naming the field, the value and the rule
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if fmt == "json":
        print(json.dumps(s, indent=1, sort_keys=True))
    else:
        _print_text(s)
    return 0


def _summary_from(root: Any) -> dict[str, Any]:
    """NS options from the optimizer group; optimizers without them (AdamW) get MCore's Muon defaults."""
    from muonbench.schema import MatrixOptimizerSchema, algorithm_config
    from optim.registry import spec

    opt, dist = root.optimizer, root.parallelism.distribution
    opts: dict[str, Any] = {}
    if isinstance(opt, MatrixOptimizerSchema):
        opts.update(
            split_qkv=opt.split_qkv,
            split_mla_kv_down=opt.split_mla_kv_down,
            split_gate_up=opt.split_gate_up,
            router_to_matrix=opt.router_to_matrix,
            distributed=dist.distributed,
            tp_mode=dist.tp_mode,
        )
    ns_steps = spec(opt.name).ns_steps(algorithm_config(opt))
    if ns_steps:
        opts["num_ns_steps"] = ns_steps
    return summary(root.model, root.parallelism, **opts)


if __name__ == "__main__":
    from bench import entry

    raise SystemExit(entry.run(main))
