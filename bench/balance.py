"""Layer-wise optimizer balance from shapes alone (no GPU): per-rank Newton-Schulz load, imbalance, bytes moved.

    python -m bench.balance model=kimi_k2 parallelism=pp4_dp64_ep64 [strategy=all|round_robin|ping_pong_numel|
        lpt_cost] [format=text|json] [cost_table=<json>] [grad_bytes=4] [param_bytes=2] [ranks=summary|all]

Every other `key=value` is a Hydra override of the config tree (`bench.config.load`).

Model of a step (one matrix = one owner, `optim.distributed.assignment`):
- Pipeline stages come from `parallelism.pipeline_layout` (Megatron syntax, e.g. `Et*4|(t*4|)*14tL`; chunk i runs
  on PP rank i % pp) or an even split. Stage s holds its layers' matrices; DP ranks of that stage share them.
- Expert matrices: each EP rank holds num_experts / ep experts per MoE layer; they are spread over its expert-DP
  group (size dp * tp * cp / (ep * etp)). Dense matrices are spread over the DP group. lpt_cost places experts
  first and the dense matrices on top of those loads; the published strategies place both independently.
- Load of a rank = sum over its distinct shapes of the batched NS cost (`CostModel`, or a measured table).
  With TP > 1 every TP rank is charged the full matrix (duplicated TP mode, MCore's default).
- `imbalance` = max / mean load over the ranks of one DP group, worst group: what the assignment controls.
  `imbalance_world` = max / mean over all ranks (also includes pipeline-stage imbalance, which no assignment fixes).
- Bytes sent per rank per step (max over ranks), grads in `grad_bytes`, params in `param_bytes`:
  ours (`reduce_scatter`): reduce-scatter of grads + all-gather of params, both over per-rank segments padded to the
  largest; non-matrix (AdamW) parameters are sharded element-wise and fill the smaller segments first.
  published (`all_reduce`): ring all-reduce of all grads (2 (N-1)/N of the bytes) + variable-size all-gather
  (each owner sends its bytes to N - 1 peers). Norm weights are not counted (<0.01% of bytes).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import Any

BALANCE_KEYS = ("strategy", "format", "cost_table", "grad_bytes", "param_bytes", "ranks")
STRATEGIES = ("round_robin", "ping_pong_numel", "lpt_cost")


@dataclass(frozen=True, slots=True)
class Mat:
    name: str
    rows: int
    cols: int
    expert: bool


def parse_layout(layout: str, *, num_layers: int, pp: int, vp: int) -> list[dict[str, int]]:
    """Per PP rank: {"layers": decoder layers, "first": index of its first layer... "embedding", "loss"} counts.

    Returns one dict per PP rank with keys `layers` (list of global decoder layer indices is in `layer_ids`),
    `embedding` and `loss` (0/1).
    """
    stages: list[dict[str, Any]] = [{"layer_ids": [], "embedding": 0, "loss": 0} for _ in range(pp)]
    if not layout:
        chunks = pp * vp
        per = num_layers // chunks
        text = "|".join(("E" if i == 0 else "") + "t" * per + ("L" if i == chunks - 1 else "") for i in range(chunks))
    else:
        text = layout.replace(" ", "")
        while (new := re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)) != text:
            text = new
        text = re.sub(r"([A-Za-z])\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    chunks_ = text.split("|")
    if len(chunks_) != pp * vp:
        raise ValueError(f"parallelism.pipeline_layout={layout!r}: expands to {len(chunks_)} chunks; "
                         f"needs PP x VP = {pp}x{vp} = {pp * vp}")
    layer = 0
    for i, chunk in enumerate(chunks_):
        st = stages[i % pp]
        for ch in chunk:
            if ch == "t":
                st["layer_ids"].append(layer)
                layer += 1
            elif ch == "E":
                st["embedding"] += 1
            elif ch == "L":
                st["loss"] += 1
            elif ch != "m":
                raise ValueError(f"parallelism.pipeline_layout={layout!r}: unknown layer type {ch!r} "
                                 "(allowed E, t, m, L)")
    if layer != num_layers:
        raise ValueError(f"parallelism.pipeline_layout={layout!r}: has {layer} decoder layers, "
                         f"model.num_layers={num_layers}")
    return stages


def layer_matrices(model: Any, layer: int, *, split_qkv: bool = True) -> list[Mat]:
    """Muon-managed matrices (Megatron out x in) of one decoder layer; experts listed one by one."""
    h, g = model.hidden_size, 3 if model.gated_linear_unit else 2
    mats: list[Mat] = []
    if model.attention == "mla":
        nh, qk = model.num_attention_heads, model.qk_head_dim + model.qk_pos_emb_head_dim
        if model.q_lora_rank:
            mats += [Mat("q_down", model.q_lora_rank, h, False), Mat("q_up", nh * qk, model.q_lora_rank, False)]
        else:
            mats.append(Mat("q", nh * qk, h, False))
        mats += [Mat("kv_down", model.kv_lora_rank + model.qk_pos_emb_head_dim, h, False),
                 Mat("kv_up", nh * (model.qk_head_dim + model.v_head_dim), model.kv_lora_rank, False),
                 Mat("o_proj", h, nh * model.v_head_dim, False)]
    else:
        q, kv = model.num_attention_heads * model.kv_channels, model.num_query_groups * model.kv_channels
        mats += ([Mat("q", q, h, False), Mat("k", kv, h, False), Mat("v", kv, h, False)] if split_qkv
                 else [Mat("qkv", q + 2 * kv, h, False)])
        mats.append(Mat("o_proj", h, q, False))
    if layer < model.num_dense_layers or not model.num_experts:
        return mats + [Mat("fc1", g * model.ffn_hidden_size, h, False), Mat("fc2", h, model.ffn_hidden_size, False)]
    mats.append(Mat("router", model.num_experts, h, False))
    if model.moe_shared_expert_intermediate_size:
        f = model.moe_shared_expert_intermediate_size
        mats += [Mat("shared_fc1", g * f, h, False), Mat("shared_fc2", h, f, False)]
    return mats


def expert_matrices(model: Any, layer: int, experts_per_rank: int) -> list[Mat]:
    if layer < model.num_dense_layers or not model.num_experts:
        return []
    g, f, h = 3 if model.gated_linear_unit else 2, model.moe_ffn_hidden_size, model.hidden_size
    return [Mat("expert_fc1", g * f, h, True), Mat("expert_fc2", h, f, True)] * experts_per_rank


def _segments_bytes(owned: list[float], filler: float, n: int, grad_b: int, param_b: int) -> dict[str, float]:
    """Per-rank bytes sent for ours (padded RS + AG) given per-rank owned matrix elements and AdamW elements."""
    if n == 1:
        return {"ours": 0.0, "published": 0.0, "segment": max(owned) if owned else 0.0}
    total = sum(owned) + filler
    seg = max(max(owned), -(-total // n))  # element-wise AdamW fills smaller segments up to the largest
    ours = (n - 1) * seg * (grad_b + param_b)
    published = 2 * (n - 1) / n * total * grad_b + (n - 1) * max(owned) * param_b
    return {"ours": ours, "published": published, "segment": seg, "padding": n * seg / total - 1 if total else 0}


def analyse(model: Any, par: Any, strategy: str, *, cost_model: Any = None, grad_bytes: int = 4,
            param_bytes: int = 2) -> dict[str, Any]:
    """Per-rank NS load and bytes for one strategy; see the module docstring for the model."""
    from optim.distributed.assignment import CostModel, assign, imbalance, rank_loads

    cost = cost_model or CostModel()
    stages = parse_layout(par.pipeline_layout, num_layers=model.num_layers, pp=par.pp, vp=par.vp)
    dp, edp = par.dp, max(1, par.expert_dp)
    ep = par.ep if model.num_experts else 1
    e_per_rank = model.num_experts // ep if model.num_experts else 0
    vocab = -(-model.vocab_size // model.make_vocab_size_divisible_by) * model.make_vocab_size_divisible_by
    loads_all: list[float] = []
    per_stage, group_imb, bytes_ours, bytes_pub = [], [], 0.0, 0.0
    for st in stages:
        dense = [m for i in st["layer_ids"] for m in layer_matrices(model, i)]
        experts = [m for i in st["layer_ids"] for m in expert_matrices(model, i, e_per_rank)]
        e_shapes = [(m.rows, m.cols) for m in experts]
        e_owner = assign(e_shapes, edp, strategy, cost_model=cost)
        e_loads = rank_loads(e_shapes, e_owner, edp, cost_model=cost)
        # DP rank d holds expert-DP position d // ep (ranks of one EP group are consecutive)
        base = [e_loads[(d // ep) % edp] for d in range(dp)]
        d_shapes = [(m.rows, m.cols) for m in dense]
        d_owner = assign(d_shapes, dp, strategy, cost_model=cost,
                         initial_loads=base if strategy == "lpt_cost" else None)
        d_loads = rank_loads(d_shapes, d_owner, dp, cost_model=cost)
        loads = [base[d] + d_loads[d] for d in range(dp)]
        loads_all += loads * par.tp * par.cp
        group_imb.append(imbalance(loads))
        per_stage.append({"layers": len(st["layer_ids"]), "min_ms": min(loads), "mean_ms": sum(loads) / dp,
                          "max_ms": max(loads), "imbalance": imbalance(loads)})
        owned = [0.0] * dp
        for m, r in zip(dense, d_owner, strict=True):
            owned[r] += m.rows * m.cols / par.tp
        filler = (st["embedding"] + st["loss"]) * vocab * model.hidden_size / par.tp
        b = _segments_bytes(owned, filler, dp, grad_bytes, param_bytes)
        e_owned = [0.0] * edp
        for m, r in zip(experts, e_owner, strict=True):
            e_owned[r] += m.rows * m.cols / par.etp
        eb = _segments_bytes(e_owned, 0.0, edp, grad_bytes, param_bytes) if experts else {"ours": 0, "published": 0}
        bytes_ours = max(bytes_ours, b["ours"] + eb["ours"])
        bytes_pub = max(bytes_pub, b["published"] + eb["published"])
        per_stage[-1]["bytes_ours"] = b["ours"] + eb["ours"]
        per_stage[-1]["padding"] = b.get("padding", 0.0)
    return {"strategy": strategy, "imbalance": max(group_imb), "imbalance_world": imbalance(loads_all),
            "max_ms": max(loads_all), "mean_ms": sum(loads_all) / len(loads_all), "bytes_per_step": bytes_ours,
            "bytes_per_step_published_path": bytes_pub, "stages": per_stage, "rank_loads_ms": loads_all}


def _text(model: Any, par: Any, results: list[dict[str, Any]], ranks: str) -> str:
    lines = [f"bench.balance: model={model.name} parallelism={par.name} (world {par.world_size}: TP{par.tp} "
             f"PP{par.pp} VP{par.vp} CP{par.cp} DP{par.dp} EP{par.ep} ETP{par.etp}, expert-DP {par.expert_dp})",
             "NS cost per rank = sum over its distinct shapes of (fixed + count x per-matrix) ms; bytes sent per rank",
             ""]
    names = [r["strategy"] for r in results]
    lines.append(f"{'':34s}" + "".join(f"{n:>18s}" for n in names))
    rows = [("imbalance (max/mean in DP group)", "imbalance", "{:.4f}"),
            ("imbalance (max/mean over world)", "imbalance_world", "{:.4f}"),
            ("max rank NS ms", "max_ms", "{:.1f}"), ("mean rank NS ms", "mean_ms", "{:.1f}"),
            ("GB/step ours (RS + AG)", "bytes_per_step", "{:.3f}"),
            ("GB/step published (AR + AGv)", "bytes_per_step_published_path", "{:.3f}")]
    for label, key, fmt in rows:
        scale = 1e-9 if "bytes" in key else 1.0
        lines.append(f"{label:34s}" + "".join(f"{fmt.format(r[key] * scale):>18s}" for r in results))
    lines.append("")
    lines.append("per PP stage: layers, NS ms min / mean / max per rank, in-group imbalance")
    for s in range(len(results[0]["stages"])):
        cells = []
        for r in results:
            st = r["stages"][s]
            cells.append(f"{st['min_ms']:.0f}/{st['mean_ms']:.0f}/{st['max_ms']:.0f} ({st['imbalance']:.3f})")
        lines.append(f"  stage {s} ({results[0]['stages'][s]['layers']:2d} layers)        "
                     + "".join(f"{c:>26s}" for c in cells))
    if ranks == "all" or len(results[0]["rank_loads_ms"]) <= 16:
        lines.append("")
        lines.append("per-rank NS ms (rank order: stage-major, then DP rank)")
        for r in results:
            lines.append(f"  {r['strategy']:>16s}: " + " ".join(f"{x:.1f}" for x in r["rank_loads_ms"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    opts = {"strategy": "all", "format": "text", "cost_table": "", "grad_bytes": "4", "param_bytes": "2",
            "ranks": "summary"}
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
    from bench.config import load
    from optim.distributed.assignment import CostModel

    cfg = load(overrides)
    cost = CostModel.from_table(opts["cost_table"]) if opts["cost_table"] else CostModel()
    strategies = STRATEGIES if opts["strategy"] == "all" else (opts["strategy"],)
    results = [analyse(cfg.model, cfg.parallelism, s, cost_model=cost, grad_bytes=int(opts["grad_bytes"]),
                       param_bytes=int(opts["param_bytes"])) for s in strategies]
    if opts["format"] == "json":
        out: Any = [{k: v for k, v in r.items() if k != "rank_loads_ms" or opts["ranks"] == "all"} for r in results]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=1))
    else:
        print(_text(cfg.model, cfg.parallelism, results, opts["ranks"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
