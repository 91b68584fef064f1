"""Layer-wise optimizer balance from shapes alone (no GPU): per-rank Newton-Schulz load, imbalance, bytes moved.

    python -m bench.tools.balance model=kimi_k2 parallelism=pp4_dp64_ep64 [strategy=all|round_robin|ping_pong_numel|
        lpt_cost] [format=text|json] [cost_table=<json, or a bench.tools.ns_kernels results.csv>] [cost_impl=ours_gram]
        [grad_bytes=4] [param_bytes=2] [ranks=summary|all]

Every other `key=value` is a Hydra override of the config tree (`config.load`).

Model of a step (one matrix = one owner, `optim.distributed.assignment`):
- Pipeline stages come from `parallelism.pipeline_layout` (Megatron syntax, e.g. `Et*4|(t*4|)*14tL`; chunk i runs
  on PP rank i % pp) or an even split. Stage s holds its layers' matrices; DP ranks of that stage share them.
- Expert matrices: each EP rank holds num_experts / ep experts per MoE layer; they are spread over its expert-DP
  group (size dp * tp * cp / (ep * etp)). Dense matrices are spread over the DP group. lpt_cost places experts
  first and the dense matrices on top of those loads; the published strategies place both independently.
- Load of a rank = sum over its distinct shapes of the batched NS cost (`CostModel`, or a measured table).
  With TP > 1 every TP rank is charged the full matrix (duplicated TP mode, MCore's default).
- `imbalance` = max / mean load over the ranks of one DP group, worst group: what the assignment controls.
  `imbalance_bound` = the same for the best whole-matrix placement can reach at least: the stage's largest dense
  matrix on top of the smallest expert load. `imbalance_world` = max / mean over all ranks (also pipeline-stage
  imbalance, which no assignment fixes). Batching lowers the mean as well as the max, so compare `max_ms` too.
- Bytes sent per rank per step (max over ranks), grads in `grad_bytes`, params in `param_bytes`, see
  `_segments_bytes`: ours = reduce-scatter + all-gather over padded per-rank segments, or per-owner reduce and
  broadcast when padding exceeds 25% (AdamW parameters are sharded element-wise and level the segments first);
  published = all-reduce of all grads + grouped send/recv all-gather. Norm weights are not counted (<0.01%).
"""

from __future__ import annotations

import json
import sys
from typing import Any

BALANCE_KEYS = ("strategy", "format", "cost_table", "cost_impl", "grad_bytes", "param_bytes", "ranks")
STRATEGIES = ("round_robin", "ping_pong_numel", "lpt_cost")


def _segments_bytes(owned: list[float], filler: float, n: int, grad_b: int, param_b: int) -> dict[str, Any]:
    """Bytes sent per rank (slowest rank) for one group, from per-rank owned matrix elements and AdamW elements.

    ours (`ShardCollective.AUTO` of optim.distributed.layerwise): when the padding of the per-rank segments is
    <= 25%, grads go by one padded reduce-scatter and params by one padded all-gather, (N - 1) x segment each;
    otherwise one reduce / broadcast per owner of its exact bytes, ~every byte once per rank.
    published (MCore legacy): ring all-reduce of all grads, 2 (N - 1) / N of the bytes, then a variable all-gather
    as grouped send/recv, where the owner of the largest share sends it N - 1 times.
    """
    total = sum(owned) + filler
    if n == 1 or total == 0:
        return {"ours": 0.0, "published": 0.0, "padding": 0.0, "collective": "-"}
    seg = max(max(owned), -(-total // n))  # element-wise AdamW fills smaller segments up to the largest
    padding = n * seg / total - 1
    collective = "padded" if padding <= 0.25 else "per_owner"
    moved = (n - 1) * seg if collective == "padded" else total
    ours = moved * (grad_b + param_b)
    published = 2 * (n - 1) / n * total * grad_b + (n - 1) * max(owned) * param_b
    return {"ours": ours, "published": published, "padding": padding, "collective": collective}


def stage_matrices(
    model: Any,
    par: Any,
    *,
    split_qkv: bool = True,
    split_mla_kv_down: bool = False,
    split_gate_up: bool = False,
) -> list[tuple[int, list[Any], list[Any]]]:
    """Per PP rank: (decoder layers, dense matrices of the stage, expert matrices one EP rank holds)."""
    from bench.flops import enumerate_ns_matrices
    from muonbench.pipeline import stage_layers

    mats = enumerate_ns_matrices(
        model, split_qkv=split_qkv, split_mla_kv_down=split_mla_kv_down, split_gate_up=split_gate_up
    )
    experts_per_rank = model.num_experts // par.ep if model.num_experts else 0
    out = []
    for layer_ids in stage_layers(model, par):
        n_dense = sum(1 for i in layer_ids if i < model.num_dense_layers)
        n_type = {
            "all": len(layer_ids),
            "dense": n_dense,
            "moe": len(layer_ids) - n_dense if model.num_experts else 0,
        }
        dense, experts = [], []
        for m in mats:
            if m.expert:
                experts += [m] * (experts_per_rank * n_type[m.layer_type])
            else:
                dense += [m] * (m.per_layer * n_type[m.layer_type])
        out.append((len(layer_ids), dense, experts))
    return out


def analyse(
    model: Any,
    par: Any,
    strategy: str,
    *,
    cost_model: Any = None,
    grad_bytes: int = 4,
    param_bytes: int = 2,
    splits: dict[str, bool] | None = None,
) -> dict[str, Any]:
    """Per-rank NS load and bytes for one strategy; see the module docstring for the model."""
    from bench.flops import padded_vocab_size
    from optim.distributed.assignment import CostModel, assign, imbalance, rank_loads

    cost = cost_model or CostModel()
    dp, edp, ep = par.dp * par.cp, max(1, par.expert_dp), par.ep if model.num_experts else 1
    vocab = padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by)
    loads_all: list[float] = []
    per_stage, group_imb, bytes_ours, bytes_pub = [], [], 0.0, 0.0
    stages = stage_matrices(model, par, **(splits or {}))
    for s, (n_layers, dense, experts) in enumerate(stages):
        e_shapes = [(m.rows, m.cols) for m in experts]
        e_owner = assign(e_shapes, edp, strategy, cost_model=cost)
        e_loads = rank_loads(e_shapes, e_owner, edp, cost_model=cost)
        base = [e_loads[(d // ep) % edp] for d in range(dp)]  # DP rank d is expert-DP position d // ep
        d_shapes = [(m.rows, m.cols) for m in dense]
        d_owner = assign(
            d_shapes, dp, strategy, cost_model=cost, initial_loads=base if strategy == "lpt_cost" else None
        )
        d_loads = rank_loads(d_shapes, d_owner, dp, cost_model=cost)
        loads = [base[d] + d_loads[d] for d in range(dp)]
        loads_all += loads * par.tp
        group_imb.append(imbalance(loads))
        largest = max((cost.group_ms(sh, 1) for sh in d_shapes), default=0.0)
        bound = max(sum(loads) / dp, min(base) + largest) / (sum(loads) / dp)
        owned = [0.0] * dp
        for m, r in zip(dense, d_owner, strict=True):
            owned[r] += m.rows * m.cols / par.tp
        filler = ((s == 0) + (s == len(stages) - 1)) * vocab * model.hidden_size / par.tp
        b = _segments_bytes(owned, filler, dp, grad_bytes, param_bytes)
        e_owned = [0.0] * edp
        for m, r in zip(experts, e_owner, strict=True):
            e_owned[r] += m.rows * m.cols / par.etp
        eb = (
            _segments_bytes(e_owned, 0.0, edp, grad_bytes, param_bytes)
            if experts
            else {"ours": 0, "published": 0}
        )
        bytes_ours = max(bytes_ours, b["ours"] + eb["ours"])
        bytes_pub = max(bytes_pub, b["published"] + eb["published"])
        per_stage.append(
            {
                "layers": n_layers,
                "min_ms": min(loads),
                "mean_ms": sum(loads) / dp,
                "max_ms": max(loads),
                "imbalance": imbalance(loads),
                "bound": bound,
                "bytes_ours": b["ours"] + eb["ours"],
                "padding": b.get("padding", 0.0),
                "collective": b.get("collective", "-"),
            }
        )
    return {
        "strategy": strategy,
        "imbalance": max(group_imb),
        "imbalance_world": imbalance(loads_all),
        "imbalance_bound": max(st["bound"] for st in per_stage),
        "max_ms": max(loads_all),
        "mean_ms": sum(loads_all) / len(loads_all),
        "bytes_per_step": bytes_ours,
        "bytes_per_step_published_path": bytes_pub,
        "stages": per_stage,
        "rank_loads_ms": loads_all,
    }


def _text(model: Any, par: Any, results: list[dict[str, Any]], ranks: str) -> str:
    lines = [
        (
            f"bench.tools.balance: model={model.name} parallelism={par.name} (world {par.world_size}: TP{par.tp} "
            f"PP{par.pp} VP{par.vp} CP{par.cp} DP{par.dp} EP{par.ep} ETP{par.etp}, expert-DP {par.expert_dp})"
        ),
        "NS ms per rank = sum over its distinct shapes of (fixed + count x per-matrix) ms (batched per shape);",
        "bytes = sent per rank per step, slowest rank (grads 4 B, params 2 B unless overridden)",
        "",
    ]
    lines.append(f"{'':40s}" + "".join(f"{r['strategy']:>17s}" for r in results))
    rows = [
        ("imbalance max/mean in DP group (worst)", "imbalance", "{:.4f}"),
        ("  whole-matrix lower bound", "imbalance_bound", "{:.4f}"),
        ("imbalance max/mean over world", "imbalance_world", "{:.4f}"),
        ("max rank NS ms", "max_ms", "{:.1f}"),
        ("mean rank NS ms", "mean_ms", "{:.1f}"),
        ("GB/step ours (RS+AG, padded or per-owner)", "bytes_per_step", "{:.2f}"),
        ("GB/step published (AR + grouped AGv)", "bytes_per_step_published_path", "{:.2f}"),
    ]
    for label, key, fmt in rows:
        scale = 1e-9 if "bytes" in key else 1.0
        lines.append(f"{label:40s}" + "".join(f"{fmt.format(r[key] * scale):>17s}" for r in results))
    lines += [
        "",
        (
            "per PP stage: NS ms per rank min / mean / max (in-group imbalance; bound), dense-segment padding "
            "-> collective"
        ),
    ]
    for s in range(len(results[0]["stages"])):
        lines.append(f"  stage {s} ({results[0]['stages'][s]['layers']} layers)")
        for r in results:
            st = r["stages"][s]
            lines.append(
                f"    {r['strategy']:>16s}: {st['min_ms']:.1f} / {st['mean_ms']:.1f} / {st['max_ms']:.1f} "
                f"({st['imbalance']:.4f}; bound {st['bound']:.4f}), padding {st['padding']:.2f} -> "
                f"{st['collective']}"
            )
    if ranks == "all" or len(results[0]["rank_loads_ms"]) <= 16:
        lines += ["", "per-rank NS ms (stage-major, then DP rank)"]
        for r in results:
            lines.append(f"  {r['strategy']:>16s}: " + " ".join(f"{x:.1f}" for x in r["rank_loads_ms"]))
    return "\n".join(lines)


def cost_model_from(path: str, impl: str) -> Any:
    """CostModel from a JSON table (`CostModel.from_table`) or a `bench.tools.ns_kernels` results.csv.

    From the CSV (rows with kind == "ns" and the given impl): the fixed cost of a call is the fastest single-matrix
    time of that impl (a launch-bound shape such as a router), and each shape's per-matrix cost is
    (ms - fixed) / batch. Shapes not measured fall back to the analytic model with that fixed cost.
    """
    import csv

    from optim.distributed.assignment import CostModel, canonical

    if not path.endswith(".csv"):
        return CostModel.from_table(path)
    with open(path, newline="") as f:
        rows = [
            r for r in csv.DictReader(f) if r.get("kind") == "ns" and r.get("impl") == impl and r.get("ms")
        ]
    if not rows:
        raise ValueError(f"cost_table={path!r}: no rows with kind=ns and impl={impl!r}")
    fixed = min(float(r["ms"]) for r in rows if int(r["batch"]) == 1)
    table = {
        canonical((int(r["rows"]), int(r["cols"]))): (
            fixed,
            max(0.0, float(r["ms"]) - fixed) / int(r["batch"]),
        )
        for r in rows
    }
    return CostModel(fixed_ms=fixed, table=table)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    from muonbench.cli_help import usage_help

    if usage_help(
        args,
        "bench.tools.balance",
        "Layer-wise optimizer balance from shapes alone (no GPU): per-rank Newton-Schulz load, imbalance,\n"
        "bytes moved, for each assignment strategy.",
        tool_options={
            "strategy=all|" + "|".join(STRATEGIES): "assignment strategies to compare (default all)",
            "format=text|json": "output format (default text)",
            "cost_table=PATH": "measured NS costs (json, or a bench.tools.ns_kernels results.csv)",
            "cost_impl=NAME": "implementation column of the cost table (default ours_gram)",
            "grad_bytes=N, param_bytes=N": "bytes per gradient / parameter element (default 4, 2)",
            "ranks=summary|all": "per-rank table (default summary)",
        },
        examples=(
            "model=kimi_k2 parallelism=pp4_dp64_ep64",
            "model=qwen3_30b_a3b parallelism=dp8_ep8 format=json",
        ),
    ):
        return 0
    opts = {
        "strategy": "all",
        "format": "text",
        "cost_table": "",
        "cost_impl": "ours_gram",
        "grad_bytes": "4",
        "param_bytes": "2",
        "ranks": "summary",
    }
    overrides = []
    for a in args:
        key, _, value = a.partition("=")
        if key in BALANCE_KEYS:
            opts[key] = value
        else:
            overrides.append(a)
    allowed = {"strategy": (*STRATEGIES, "all"), "format": ("text", "json"), "ranks": ("summary", "all")}
    for key, choices in allowed.items():
        if opts[key] not in choices:
            raise ValueError(f"{key}={opts[key]!r}: must be one of {list(choices)}")
    from muonbench import load
    from muonbench.schema import MatrixOptimizerSchema
    from optim.distributed.assignment import CostModel

    cfg = load(overrides)
    cost = cost_model_from(opts["cost_table"], opts["cost_impl"]) if opts["cost_table"] else CostModel()
    strategies = STRATEGIES if opts["strategy"] == "all" else (opts["strategy"],)
    opt = cfg.optimizer
    splits = (
        {
            "split_qkv": opt.split_qkv,
            "split_mla_kv_down": opt.split_mla_kv_down,
            "split_gate_up": opt.split_gate_up,
        }
        if isinstance(opt, MatrixOptimizerSchema)
        else {}
    )
    results = [
        analyse(
            cfg.model,
            cfg.parallelism,
            s,
            cost_model=cost,
            grad_bytes=int(opts["grad_bytes"]),
            param_bytes=int(opts["param_bytes"]),
            splits=splits,
        )
        for s in strategies
    ]
    if opts["format"] == "json":
        out: Any = [
            {k: v for k, v in r.items() if k != "rank_loads_ms" or opts["ranks"] == "all"} for r in results
        ]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=1))
    else:
        print(_text(cfg.model, cfg.parallelism, results, opts["ranks"]))
    return 0


if __name__ == "__main__":
    from bench import entry

    raise SystemExit(entry.run(main))
