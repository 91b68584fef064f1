"""Optimizer step and data-parallel communication per GPU, for the two algorithm profiles.

`published` (blog-era NVIDIA, MCore legacy `LayerWiseDistributedOptimizer` as MB 26.02 runs it): gradients
all-reduced (overlapped with backward), every parameter dealt ping-pong by numel over DP (experts over expert-DP),
a per-matrix NS loop (one NS call each, launch-bound below a ~1000 short side: host cost measured on our H200),
then a blocking variable-size all-gather of the updated parameters. `ours`: gradients reduce-scattered into
owner-aligned buckets (overlapped), `parallelism.distribution.assignment` (lpt_cost by default, on the batched NS cost), one batched
NS call per shape and rank with our measured kernels (plain or Gram-NS, whichever the plan picks; Gram-NS FLOPs on
the curve when no measurement exists), non-matrix parameters in an element-wise distributed AdamW, the parameter
all-gather overlapped with the next forward. AdamW (both profiles): Megatron's distributed optimizer with overlapped reduce-scatter and
all-gather, as in the published AdamW runs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from bench import flops
from bench.tools.perfmodel import constants as C
from bench.tools.perfmodel import hwprofile, links, nscost
from muonbench.pipeline import stage_layers
from muonbench.schema import (
    DistributionConfig,
    HardwareConfig,
    ModelConfig,
    ParallelismConfig,
    PrecisionConfig,
)
from optim.distributed.assignment import CostModel, assign, canonical

PROFILES = ("published", "ours")


@dataclass(frozen=True, kw_only=True, slots=True)
class Algo:
    """What the optimizer does, resolved from the profile and the optimizer config."""

    optimizer: str
    """adamw | muon (other matrix optimizers are modelled as Muon's communication with their own math: N/A)."""
    profile: str
    grad_sync: str
    assignment: str
    overlap_param_gather: bool
    batched: bool
    convention: str
    """NS FLOP convention of the kernel: plain | gram."""
    num_ns_steps: int
    tp_mode: str
    split_gate_up: bool = False
    """SwiGLU fc1 orthogonalized as its gate and up halves (`optimizer.split_gate_up`): half the rows, twice the
    matrices, about 2.3x fewer NS FLOPs for a Qwen3 expert (1536 x 2048)."""
    split_qkv: bool = True
    """GQA linear_qkv orthogonalized as Q, K and V (`optimizer.split_qkv`; MCore's default)."""
    gram_ns: bool = True
    """Our plan may pick Gram-NS per shape (`optimizer.use_gram_ns`); False: plain NS kernels only."""
    ns_precision: str = "bf16"
    """NS iterate: bf16 and fp16 at the bf16 GEMM rate, fp32 at `constants.FP32_NS_RATE_FRACTION` of it."""


def resolve(
    optimizer_cfg: object, distribution: DistributionConfig, profile: str, *, ns_as_configured: bool = False
) -> Algo:
    """The algorithm of a profile. `published` fixes the blog-era path; `ours` honours `distribution`'s grad_sync,
    assignment and overlap_param_gather unless `implementation=megatron` (whose knobs describe the published path:
    then ours' defaults reduce_scatter, lpt_cost, overlap). Both take num_ns_steps, split_qkv and split_gate_up
    from the optimizer and tp_mode from `distribution`. The profiles price bf16 NS (ours: plain or Gram-NS,
    whichever measured faster); `ns_as_configured` takes `ns_precision` and `use_gram_ns` from the optimizer."""
    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r}: must be one of {list(PROFILES)}")
    name = getattr(optimizer_cfg, "name", "adamw")
    if name not in ("adamw", "muon"):
        raise ValueError(f"optimizer.name={name!r}: the performance model covers ['adamw', 'muon']")
    steps = int(getattr(optimizer_cfg, "num_ns_steps", 5))
    tp_mode = distribution.tp_mode
    split_gate_up = bool(getattr(optimizer_cfg, "split_gate_up", False))
    split_qkv = bool(getattr(optimizer_cfg, "split_qkv", True))
    precision = str(getattr(optimizer_cfg, "ns_precision", "bf16")) if ns_as_configured else "bf16"
    gram = bool(getattr(optimizer_cfg, "use_gram_ns", False)) if ns_as_configured else True
    if profile == "published":
        return Algo(
            optimizer=name,
            profile=profile,
            grad_sync="all_reduce",
            assignment="ping_pong_numel",
            overlap_param_gather=False,
            batched=False,
            convention="plain",
            num_ns_steps=steps,
            tp_mode=tp_mode,
            split_gate_up=split_gate_up,
            split_qkv=split_qkv,
            gram_ns=False,
            ns_precision=precision,
        )
    if getattr(optimizer_cfg, "implementation", "ours") == "megatron":  # published knobs: use ours' defaults
        grad_sync, assignment, overlap = "reduce_scatter", "lpt_cost", True
    else:
        grad_sync = distribution.grad_sync
        assignment = distribution.assignment
        overlap = distribution.overlap_param_gather
    return Algo(
        optimizer=name,
        profile=profile,
        grad_sync=grad_sync,
        assignment=assignment,
        overlap_param_gather=overlap,
        batched=True,
        convention="gram" if gram else "plain",
        num_ns_steps=steps,
        tp_mode=tp_mode,
        split_gate_up=split_gate_up,
        split_qkv=split_qkv,
        gram_ns=gram,
        ns_precision=precision,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Item:
    """One parameter as the optimizer sees it on one GPU (a TP shard where sharded)."""

    rows: int
    cols: int
    expert: bool
    muon: bool
    tp_dim: int


def stage_items(
    model: ModelConfig,
    par: ParallelismConfig,
    stage: int,
    layer_ids: list[int],
    *,
    split_gate_up: bool = False,
    split_qkv: bool = True,
) -> list[Item]:
    """Parameters of one pipeline stage held by one TP rank: experts local to its EP rank, all dense matrices of the
    stage (to be dealt over DP), embedding / output on the first / last stage (AdamW); Muon's matrices after its
    splits (QKV with `split_qkv`, gate / up with `split_gate_up`)."""
    mats = flops.enumerate_ns_matrices(model, split_qkv=split_qkv, split_gate_up=split_gate_up)
    n_dense = sum(1 for i in layer_ids if i < model.num_dense_layers) if model.num_experts else len(layer_ids)
    per_type = {"all": len(layer_ids), "dense": n_dense, "moe": len(layer_ids) - n_dense}
    out: list[Item] = []
    for m in mats:
        n = per_type[m.layer_type] * (m.per_layer // par.ep if m.expert else m.per_layer)
        tp = par.etp if m.expert else par.tp
        rows, cols = m.rows, m.cols
        if tp > 1 and m.tp_partition_dim == 0:
            rows //= tp
        elif tp > 1 and m.tp_partition_dim == 1:
            cols //= tp
        out += [Item(rows=rows, cols=cols, expert=m.expert, muon=True, tp_dim=m.tp_partition_dim)] * n
    v_pad = flops.padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by, par.tp)
    table = Item(rows=v_pad // par.tp, cols=model.hidden_size, expert=False, muon=False, tp_dim=0)
    if stage == 0:
        out.append(table)  # embedding
    if stage == par.pp - 1 and not model.tie_embeddings:
        out.append(table)  # output layer
    return out


def _muon_item_ms(
    it: Item,
    par: ParallelismConfig,
    hw: HardwareConfig,
    algo: Algo,
    rate_hbm: float,
    table: dict[tuple[int, int], float],
) -> tuple[float, float]:
    """(GPU ms incl. TP communication, element-wise ms) of one Muon matrix shard."""
    tp = par.etp if it.expert else par.tp
    full = (it.rows * tp, it.cols) if it.tp_dim == 0 else (it.rows, it.cols * tp)
    mode = algo.tp_mode
    if mode == "auto":
        mode = nscost.choose_tp_mode(
            full[0], full[1], tp, hw, partition_dim=it.tp_dim, num_ns_steps=algo.num_ns_steps
        )
    cost = nscost.tp_cost(
        full[0],
        full[1],
        tp,
        hw,
        mode if tp > 1 else "blockwise",
        partition_dim=it.tp_dim,
        num_ns_steps=algo.num_ns_steps,
        convention=algo.convention,
        triangular=algo.profile == "ours",
        table=table,
        precision=algo.ns_precision,
    )
    elem = it.rows * it.cols * C.MUON_ELEMENTWISE_BYTES_PER_PARAM.value / rate_hbm * 1e3
    return cost.total_ms, elem


def rank_loads_ms(
    items: list[Item],
    owners: list[int],
    n_ranks: int,
    par: ParallelismConfig,
    hw: HardwareConfig,
    algo: Algo,
    rate_hbm: float,
    table: dict[tuple[int, int], float],
    base: list[float],
    *,
    ns_only: bool = False,
) -> list[float]:
    """Optimizer milliseconds per rank given owners (adds to `base`); `ns_only`: Newton-Schulz alone (host calls,
    GPU work and TP communication; no element-wise or AdamW work)."""
    loads = list(base)
    host_call = nscost.host_call_ms(hw, algo.num_ns_steps, algo.profile)
    groups: list[dict[tuple[int, int, bool, int], int]] = [defaultdict(int) for _ in range(n_ranks)]
    for it, r in zip(items, owners, strict=True):
        if not it.muon or algo.optimizer == "adamw":
            if not ns_only:
                loads[r] += it.rows * it.cols * C.ADAMW_BYTES_PER_PARAM.value / rate_hbm * 1e3
        elif algo.batched:
            groups[r][(it.rows, it.cols, it.expert, it.tp_dim)] += 1  # one batched call per shape
        else:  # per-matrix NS loop: one launch-bound NS call unless the GPU work is longer
            gpu, elem = _muon_item_ms(it, par, hw, algo, rate_hbm, table)
            loads[r] += max(host_call, gpu) + (0.0 if ns_only else elem)
    for r, g in enumerate(groups):
        for (rows, cols, expert, tp_dim), count in g.items():
            gpu, elem = _muon_item_ms(
                Item(rows=rows, cols=cols, expert=expert, muon=True, tp_dim=tp_dim),
                par,
                hw,
                algo,
                rate_hbm,
                table,
            )
            loads[r] += host_call + count * (gpu + (0.0 if ns_only else elem))
    return loads


def _cost_model(
    items: list[Item],
    par: ParallelismConfig,
    hw: HardwareConfig,
    algo: Algo,
    rate_hbm: float,
    table: dict[tuple[int, int], float],
) -> CostModel:
    """The shared assignment cost model, filled with this hardware's per-shape milliseconds."""
    terms: dict[tuple[int, int], tuple[float, float]] = {}
    for it in items:
        key = canonical((it.rows, it.cols))
        if key not in terms:
            if it.muon:
                gpu, elem = _muon_item_ms(it, par, hw, algo, rate_hbm, table)
                terms[key] = (nscost.host_call_ms(hw, algo.num_ns_steps, algo.profile), gpu + elem)
            else:
                terms[key] = (0.0, it.rows * it.cols * C.ADAMW_BYTES_PER_PARAM.value / rate_hbm * 1e3)
    return CostModel(table=terms, num_ns_steps=algo.num_ns_steps)


def optimizer_step(
    model: ModelConfig,
    par: ParallelismConfig,
    hw: HardwareConfig,
    precision: PrecisionConfig,
    algo: Algo,
    *,
    backward_s: float,
) -> dict[str, float]:
    """Seconds of the optimizer step and of the exposed data-parallel communication (worst GPU), and `ns_s`: the
    Newton-Schulz seconds of the GPU with the most (part of `optimizer_step`, not a term of its own).

    `backward_s`: the backward compute time of the slowest stage, the window in which gradient syncs overlap.
    """
    eff = hwprofile.effective(hw)
    rate_hbm = hw.hbm_tbps * 1e12 * eff.hbm.value
    rate_muon = hw.hbm_tbps * 1e12 * (eff.optimizer_hbm or eff.hbm).value  # Muon's fused element-wise kernels
    table = nscost.hardware_table(hw, algo.profile, gram=algo.gram_ns)
    dp, edp = par.dp * par.cp, max(1, par.expert_dp)
    dp_link = links.group_link(hw, dp, stride=par.tp)
    edp_link = links.group_link(hw, edp, stride=par.tp * par.cp * par.ep)
    worst = {"optimizer_step": 0.0, "grad_sync_exposed": 0.0, "param_gather_exposed": 0.0, "ns_s": 0.0}
    for stage, layer_ids in enumerate(stage_layers(model, par)):
        items = stage_items(
            model, par, stage, layer_ids, split_gate_up=algo.split_gate_up, split_qkv=algo.split_qkv
        )
        dense = [it for it in items if not it.expert]
        experts = [it for it in items if it.expert]
        n_dense = sum(it.rows * it.cols for it in dense)
        n_expert = sum(it.rows * it.cols for it in experts)
        ns = 0.0
        if algo.optimizer == "adamw":  # distributed optimizer: even element shards
            step = (n_dense / dp + n_expert / edp) * C.ADAMW_BYTES_PER_PARAM.value / rate_hbm
            sync = "reduce_scatter"
        else:
            step_ms, ns_ms = _muon_step_ms(dense, experts, par, hw, algo, rate_muon, table, dp, edp)
            step, ns = step_ms / 1e3, ns_ms / 1e3
            sync = algo.grad_sync
        grad = (n_dense * C.GRAD_BYTES.value, n_expert * C.GRAD_BYTES.value)
        coll = links.all_reduce if sync == "all_reduce" else links.reduce_scatter
        t_sync = coll(grad[0], dp, dp_link) + coll(grad[1], edp, edp_link)
        bucket = C.BUCKET_ELEMENTS.value * C.GRAD_BYTES.value
        t_bucket = coll(min(bucket, grad[0]), dp, dp_link) + coll(min(bucket, grad[1]), edp, edp_link)
        sync_exposed = max(t_bucket, t_sync - backward_s)
        pbytes = (
            1.0 if (algo.optimizer == "adamw" and precision.fp8_param_gather) else C.PARAM_GATHER_BYTES.value
        )
        if algo.optimizer == "muon" and not algo.overlap_param_gather:  # blocking all_gatherv after the step
            gather = links.all_gatherv(n_dense * pbytes, dp, dp_link) + links.all_gatherv(
                n_expert * pbytes, edp, edp_link
            )
        else:  # overlapped with the next forward: the first bucket is exposed
            first = C.BUCKET_ELEMENTS.value * pbytes
            gather = links.all_gather(min(first, n_dense * pbytes), dp, dp_link) + links.all_gather(
                min(first, n_expert * pbytes), edp, edp_link
            )
        norm = 2 * links.all_reduce(4.0, par.world_size, links.group_link(hw, par.world_size))
        worst["optimizer_step"] = max(worst["optimizer_step"], step + norm)
        worst["ns_s"] = max(worst["ns_s"], ns)
        worst["grad_sync_exposed"] = max(worst["grad_sync_exposed"], sync_exposed)
        worst["param_gather_exposed"] = max(worst["param_gather_exposed"], gather)
    return worst


def _muon_step_ms(
    dense: list[Item],
    experts: list[Item],
    par: ParallelismConfig,
    hw: HardwareConfig,
    algo: Algo,
    rate_hbm: float,
    table: dict[tuple[int, int], float],
    dp: int,
    edp: int,
) -> tuple[float, float]:
    """Slowest rank's Muon step (ms) on one stage, experts dealt over expert-DP and dense items over DP, and the
    most NS milliseconds of any rank with the same owners."""
    strategy = algo.assignment
    cm = _cost_model(dense + experts, par, hw, algo, rate_hbm, table)
    e_owner = assign([(it.rows, it.cols) for it in experts], edp, strategy, cost_model=cm) if experts else []
    e_loads = rank_loads_ms(experts, e_owner, edp, par, hw, algo, rate_hbm, table, [0.0] * edp)
    e_ns = rank_loads_ms(experts, e_owner, edp, par, hw, algo, rate_hbm, table, [0.0] * edp, ns_only=True)
    base = [e_loads[r % edp] for r in range(dp)]  # expert loads tiled over the stage's DP ranks
    ns_base = [e_ns[r % edp] for r in range(dp)]
    if algo.profile == "ours":  # AdamW parameters go to an element-wise distributed optimizer: even shards
        adam = sum(it.rows * it.cols for it in dense if not it.muon)
        base = [b + adam / dp * C.ADAMW_BYTES_PER_PARAM.value / rate_hbm * 1e3 for b in base]
        dense = [it for it in dense if it.muon]
    shapes = [(it.rows, it.cols) for it in dense]
    kw = {"initial_loads": base} if strategy == "lpt_cost" else {}
    owners = assign(shapes, dp, strategy, cost_model=cm, **kw) if dense else []
    loads = rank_loads_ms(dense, owners, dp, par, hw, algo, rate_hbm, table, base)
    ns = rank_loads_ms(dense, owners, dp, par, hw, algo, rate_hbm, table, ns_base, ns_only=True)
    return max(loads), max(ns)


def state_memory_gib(model: ModelConfig, par: ParallelismConfig, algo: Algo) -> float:
    """Worst GPU's parameters, gradients and optimizer state in GiB (activations excluded): bf16 weights (2 B),
    fp32 main_grad (4 B), and on the owned share fp32 master + Adam m, v (12 B) or master + Muon momentum (8 B)."""
    dp, edp = par.dp * par.cp, max(1, par.expert_dp)
    worst = 0.0
    for stage, layer_ids in enumerate(stage_layers(model, par)):
        items = stage_items(model, par, stage, layer_ids)
        n_dense = sum(it.rows * it.cols for it in items if not it.expert)
        n_expert = sum(it.rows * it.cols for it in items if it.expert)
        state = 12.0 if algo.optimizer == "adamw" else 8.0
        total = (n_dense + n_expert) * 6.0 + (n_dense / dp + n_expert / edp) * state
        worst = max(worst, total / 2**30)
    return worst
