"""Model FLOPs as Megatron counts them, and Newton-Schulz (NS) FLOPs per step and per GPU.

Model FLOPs follow MCore `megatron/training/training.py::num_floating_point_operations` (= MB
`training/utils/flop_utils.py`) for dense-sequence (BSHD) batches. NS FLOPs per matrix are `optim.cost.ns_flops`
(plain k (4 m^2 n + 2 m^3), syrk and gram conventions); this module counts them over every matrix the matrix
optimizer orthogonalizes, per step and per GPU under a parallel layout.

Imports no torch (a login node can run it):
CLI: `python -m bench.tools.flops model=kimi_k2 parallelism=pp4_dp64_ep64 [format=json]` (summary in
`bench/tools/flops.py`).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from muonbench.pipeline import stage_layers
from muonbench.schema import DISTRIBUTED_CHOICES, ModelConfig, ParallelismConfig
from optim.configs import TP_MODE_CHOICES, TPMode
from optim.cost import CONVENTIONS, ns_flops, ns_flops_mn


# --------------------------------------------------------------------------------------------------------------
# Model FLOPs (Megatron)
# --------------------------------------------------------------------------------------------------------------
def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int = 1) -> int:
    """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x TP."""
    multiple = divisible_by * tp
    return math.ceil(vocab_size / multiple) * multiple


def _layer_counts(model: ModelConfig) -> tuple[int, int]:
    """(dense, MoE) FFN layers; MTP layers take the type of the last decoder layer, as in Megatron."""
    if model.num_experts == 0:
        return model.num_layers + model.mtp_num_layers, 0
    n_dense = model.num_dense_layers
    n_moe = model.num_layers - n_dense
    last_is_moe = n_moe > 0
    return n_dense + (0 if last_is_moe else model.mtp_num_layers), n_moe + (
        model.mtp_num_layers if last_is_moe else 0
    )


def sliding_layers(model: ModelConfig, num_layers: int) -> int:
    """How many of `num_layers` slide (every one, or all but every `window_attn_skip_freq`-th); 0 without a window."""
    if not model.sliding_window:
        return 0
    freq = model.window_attn_skip_freq
    return num_layers - (num_layers // freq if freq else 0)


def window_context(window: int, s: int) -> float:
    """Mean keys a query sees under a causal window of `window` tokens over `s`: W - W (W - 1) / (2 s) for W < s,
    else the full causal s / 2 (MB `flop_utils`, window_size = (W - 1, 0))."""
    return window - window * (window - 1) / (2 * s) if window < s else s / 2


def model_flops_breakdown(model: ModelConfig, *, tp: int = 1) -> dict[str, float]:
    """Training FLOPs per token by term (forward + backward), at sequence length `model.seq_length`.

    Every leading 6 = 2 FLOP per multiply-add x 3 (forward GEMM + two backward GEMMs). Uncounted, as in Megatron:
    recompute, router GEMM, norms, softmax, rope, embedding lookup.
    """
    h, s = model.hidden_size, model.seq_length
    g = 3 if model.gated_linear_unit else 2  # SwiGLU: gate, up, down projections; plain MLP: up, down
    n_dense, n_moe = _layer_counts(model)
    n_layers = model.num_layers + model.mtp_num_layers
    mlp = (
        6
        * h
        * (
            g * model.ffn_hidden_size * n_dense  # dense FFN layers
            + g * model.moe_ffn_hidden_size * model.moe_router_topk * n_moe  # top-k routed experts per token
            + g * model.moe_shared_expert_intermediate_size * n_moe  # shared expert (every token)
        )
    )
    nh = model.num_attention_heads
    if model.attention == "mla":
        d_qk, d_rope, d_v = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        if model.q_lora_rank:
            # q down (h -> r_q) + q up (r_q -> n_h (d_qk + d_rope)) + q norm (the "+ 1")
            q_term = model.q_lora_rank * (h + nh * (d_qk + d_rope) + 1)
        else:
            q_term = h * nh * (d_qk + d_rope)  # one q projection
        attn_linear = (
            6
            * n_layers
            * (
                q_term
                + model.kv_lora_rank
                * (h + nh * (d_qk + d_v) + 1)  # kv down (latent) + kv up (k, v) + kv norm
                + h * d_rope  # kv down, the shared rope rows
                + nh * d_v * h  # output projection
            )
        )
        # QK^T over d_qk + d_rope and AV over d_v: 2 FLOP x 3 x s x (...) / 2 for the causal half
        attn_core = 3 * n_layers * s * nh * (d_qk + d_rope + d_v)
    else:
        q = nh * model.kv_channels  # query projection width
        kv = model.num_query_groups * model.kv_channels  # key (and value) width under GQA
        attn_linear = 6 * n_layers * (h * (q + 2 * kv) + q * h)  # fused QKV + output projection
        # QK^T and AV: 2 GEMMs x 2 FLOP x 3 x q x (mean causal context: s / 2, or the window's on a sliding layer)
        n_slide = sliding_layers(model, n_layers)
        attn_core = 12 * q * ((n_layers - n_slide) * s / 2 + n_slide * window_context(model.sliding_window, s))
    mtp = 6 * model.mtp_num_layers * (3 * h + 2 * h * h)  # MTP norms and eh projection
    v_pad = padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by, tp)
    logits = 6 * h * v_pad * (1 + model.mtp_num_layers)  # output layer over the padded vocabulary
    return {
        "mlp": float(mlp),
        "attn_linear": float(attn_linear + mtp),
        "attn_core": float(attn_core),
        "logits": float(logits),
    }


def model_flops_per_token(model: ModelConfig, *, tp: int = 1) -> float:
    """Megatron's training FLOPs per token (forward + backward) at `model.seq_length`."""
    return sum(model_flops_breakdown(model, tp=tp).values())


def model_flops_per_step(model: ModelConfig, par: ParallelismConfig) -> float:
    """FLOPs of one global batch: GBS x seq tokens (vocabulary padded for `par.tp`)."""
    return par.gbs * model.seq_length * model_flops_per_token(model, tp=par.tp)


# --------------------------------------------------------------------------------------------------------------
# NS FLOPs per matrix
# --------------------------------------------------------------------------------------------------------------
# --------------------------------------------------------------------------------------------------------------
# The matrices a matrix optimizer orthogonalizes
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class NSMatrix:
    """One kind of orthogonalized matrix (Megatron weight, out x in) and how many the model holds."""

    name: str
    """Megatron parameter name pattern, with the split part in brackets (e.g. `self_attention.linear_qkv[q]`)."""
    rows: int
    cols: int
    count: int
    """Instances in the whole model."""
    kind: str
    """Short label for tables, e.g. `attn_q`, `expert_fc1`, `mla_kv_up`."""
    expert: bool
    """Routed-expert weight (owned by EP ranks); shared experts are not experts here, as in MCore's routing."""
    layer_type: str
    """`all` (every decoder layer: attention), `dense` (dense FFN layers) or `moe` (MoE layers)."""
    per_layer: int = 1
    """Instances per layer of `layer_type`."""
    tp_partition_dim: int = 0
    """Dim split by tensor parallelism: 0 rows (column-parallel), 1 cols (row-parallel), -1 replicated."""


def enumerate_ns_matrices(
    model: ModelConfig,
    *,
    split_qkv: bool = True,
    split_mla_kv_down: bool = False,
    split_gate_up: bool = False,
    router_to_matrix: bool = True,
) -> list[NSMatrix]:
    """Every matrix the optimizer orthogonalizes, after the configured splits (embedding and output go to Adam).

    split_qkv: GQA `linear_qkv` as separate Q (n_h d), K and V (n_g d) matrices (MCore's muon_split_qkv).
    split_mla_kv_down: kv_down into latent and rope rows, kv_up into K and V, q_up into no-rope and rope rows (MCore does not
    split MLA). split_gate_up: SwiGLU fc1 as separate gate and up matrices (MCore orthogonalizes them jointly).
    router_to_matrix: the MoE router weight is Muon-managed in MCore.
    """
    n_dense, n_moe = _layer_counts(model)
    n_all = model.num_layers + model.mtp_num_layers
    layers = {"all": n_all, "dense": n_dense, "moe": n_moe}
    out: list[NSMatrix] = []

    def add(
        name: str,
        rows: int,
        cols: int,
        kind: str,
        layer_type: str,
        *,
        per_layer: int = 1,
        expert: bool = False,
        tp_dim: int = 0,
    ) -> None:
        if layers[layer_type] and per_layer:
            out.append(
                NSMatrix(
                    name=name,
                    rows=rows,
                    cols=cols,
                    count=per_layer * layers[layer_type],
                    kind=kind,
                    expert=expert,
                    layer_type=layer_type,
                    per_layer=per_layer,
                    tp_partition_dim=tp_dim,
                )
            )

    h, nh = model.hidden_size, model.num_attention_heads
    sa = "self_attention"
    if model.attention == "mla":
        d_qk, d_rope, d_v = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        r_q, r_kv = model.q_lora_rank, model.kv_lora_rank
        q_src = r_q if r_q else h
        if r_q:
            add(f"{sa}.linear_q_down_proj", r_q, h, "mla_q_down", "all", tp_dim=-1)
        q_name, q_kind = (f"{sa}.linear_q_up_proj", "mla_q_up") if r_q else (f"{sa}.linear_q_proj", "mla_q")
        if split_mla_kv_down:
            add(f"{q_name}[nope]", nh * d_qk, q_src, f"{q_kind}_nope", "all")
            add(f"{q_name}[rope]", nh * d_rope, q_src, f"{q_kind}_rope", "all")
            add(f"{sa}.linear_kv_down_proj[latent]", r_kv, h, "mla_kv_down_latent", "all", tp_dim=-1)
            add(f"{sa}.linear_kv_down_proj[rope]", d_rope, h, "mla_kv_down_rope", "all", tp_dim=-1)
            add(f"{sa}.linear_kv_up_proj[k]", nh * d_qk, r_kv, "mla_kv_up_k", "all")
            add(f"{sa}.linear_kv_up_proj[v]", nh * d_v, r_kv, "mla_kv_up_v", "all")
        else:
            add(q_name, nh * (d_qk + d_rope), q_src, q_kind, "all")
            add(f"{sa}.linear_kv_down_proj", r_kv + d_rope, h, "mla_kv_down", "all", tp_dim=-1)
            add(f"{sa}.linear_kv_up_proj", nh * (d_qk + d_v), r_kv, "mla_kv_up", "all")
        add(f"{sa}.linear_proj", h, nh * d_v, "attn_proj", "all", tp_dim=1)
    else:
        q, kv = nh * model.kv_channels, model.num_query_groups * model.kv_channels
        if split_qkv:
            add(f"{sa}.linear_qkv[q]", q, h, "attn_q", "all")
            add(f"{sa}.linear_qkv[k]", kv, h, "attn_k", "all")
            add(f"{sa}.linear_qkv[v]", kv, h, "attn_v", "all")
        else:
            add(f"{sa}.linear_qkv", q + 2 * kv, h, "attn_qkv", "all")
        add(f"{sa}.linear_proj", h, q, "attn_proj", "all", tp_dim=1)

    def ffn(prefix: str, kind: str, width: int, layer_type: str, per_layer: int, expert: bool) -> None:
        if not width:
            return
        if model.gated_linear_unit and split_gate_up:
            add(
                f"{prefix}.linear_fc1[gate]",
                width,
                h,
                f"{kind}_gate",
                layer_type,
                per_layer=per_layer,
                expert=expert,
            )
            add(
                f"{prefix}.linear_fc1[up]",
                width,
                h,
                f"{kind}_up",
                layer_type,
                per_layer=per_layer,
                expert=expert,
            )
        else:
            g = 2 if model.gated_linear_unit else 1
            add(
                f"{prefix}.linear_fc1",
                g * width,
                h,
                f"{kind}_fc1",
                layer_type,
                per_layer=per_layer,
                expert=expert,
            )
        add(
            f"{prefix}.linear_fc2",
            h,
            width,
            f"{kind}_fc2",
            layer_type,
            per_layer=per_layer,
            expert=expert,
            tp_dim=1,
        )

    ffn("mlp", "dense", model.ffn_hidden_size, "dense", 1, False)
    if model.num_experts:
        if router_to_matrix:
            add("mlp.router", model.num_experts, h, "router", "moe", tp_dim=-1)
        ffn("mlp.experts", "expert", model.moe_ffn_hidden_size, "moe", model.num_experts, True)
        ffn("mlp.shared_experts", "shared", model.moe_shared_expert_intermediate_size, "moe", 1, False)
    return out


# --------------------------------------------------------------------------------------------------------------
# Per-GPU load under a parallel layout
# --------------------------------------------------------------------------------------------------------------
def _shard_cost(
    mat: NSMatrix, tp: int, tp_mode: str, num_ns_steps: int, restarts: tuple[int, ...]
) -> dict[str, float]:
    """NS FLOPs one GPU spends on its part of `mat` when the weight is split over `tp` ranks."""
    if tp == 1 or mat.tp_partition_dim < 0 or tp_mode == TPMode.DUPLICATED:  # full NS on every TP rank
        return {
            c: ns_flops(mat.rows, mat.cols, num_ns_steps, c, restart_iterations=restarts) for c in CONVENTIONS
        }
    split, other = (mat.rows, mat.cols) if mat.tp_partition_dim == 0 else (mat.cols, mat.rows)
    if tp_mode in (TPMode.BLOCKWISE, "auto"):  # each shard alone; auto's per-matrix choice counted as blockwise
        return {
            c: ns_flops(split // tp, other, num_ns_steps, c, restart_iterations=restarts) for c in CONVENTIONS
        }
    # distributed(_gram): the split dim is contracted (Gram of the other side, all-reduced); A^2 redundant on every
    # rank; distributed_gram's Gram-NS count is the "gram" convention column
    return {c: ns_flops_mn(other, split / tp, num_ns_steps, c, restarts) for c in CONVENTIONS}


@dataclass(slots=True)
class _Bin:
    cost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CONVENTIONS, 0.0))
    kinds: Counter[str] = field(default_factory=Counter)


def _lpt(items: list[tuple[str, dict[str, float]]], bins: list[_Bin]) -> None:
    """Largest (plain cost) first onto the least-loaded bin; whole matrices only."""
    heap = [(b.cost["plain"], i) for i, b in enumerate(bins)]
    heapq.heapify(heap)
    for kind, cost in sorted(items, key=lambda it: -it[1]["plain"]):
        _, i = heapq.heappop(heap)
        for c in CONVENTIONS:
            bins[i].cost[c] += cost[c]
        bins[i].kinds[kind] += 1
        heapq.heappush(heap, (bins[i].cost["plain"], i))


def ns_load_per_gpu(
    model: ModelConfig,
    par: ParallelismConfig,
    *,
    num_ns_steps: int = 5,
    split_qkv: bool = True,
    split_mla_kv_down: bool = False,
    split_gate_up: bool = False,
    router_to_matrix: bool = True,
    distributed: str = "layerwise",
    tp_mode: str = "blockwise",
    restart_iterations: tuple[int, ...] = (2,),
) -> dict[str, Any]:
    """NS FLOPs per GPU per step: max and mean over GPUs, per pipeline stage, per matrix kind.

    Placement: PP splits layers (`stage_layers`); each EP rank owns num_experts / ep experts of each MoE layer of its
    stage (dealt over its expert-DP ranks); non-expert matrices of a stage are spread over its DP x CP ranks
    (distributed='layerwise': whole matrices, cost-aware LPT on top of the expert loads; 'none': every DP rank
    orthogonalizes all of them). TP (ETP for experts) per `tp_mode`. The assignment uses the plain cost; the SYRK
    and Gram columns are evaluated on the same assignment.
    """
    if distributed not in DISTRIBUTED_CHOICES:
        raise ValueError(f"distributed={distributed!r}: must be one of {list(DISTRIBUTED_CHOICES)}")
    if tp_mode not in TP_MODE_CHOICES:
        raise ValueError(f"tp_mode={tp_mode!r}: must be one of {list(TP_MODE_CHOICES)}")
    if model.mtp_num_layers:
        raise NotImplementedError(
            f"model.mtp_num_layers={model.mtp_num_layers}: MTP layers are not placed on "
            "pipeline stages yet (both published models have none)"
        )
    mats = enumerate_ns_matrices(
        model,
        split_qkv=split_qkv,
        split_mla_kv_down=split_mla_kv_down,
        split_gate_up=split_gate_up,
        router_to_matrix=router_to_matrix,
    )
    dp_slots = par.dp * par.cp
    expert_dp = max(1, par.expert_dp)
    experts_per_rank = model.num_experts // par.ep if model.num_experts else 0
    stages: list[dict[str, Any]] = []
    all_bins: list[_Bin] = []
    for rank, layer_ids in enumerate(stage_layers(model, par)):
        n_type = {"all": len(layer_ids), "dense": sum(1 for i in layer_ids if i < model.num_dense_layers)}
        n_type["moe"] = n_type["all"] - n_type["dense"] if model.num_experts else 0
        if not model.num_experts:
            n_type["dense"] = n_type["all"]
        expert_items: list[tuple[str, dict[str, float]]] = []  # one EP rank's experts in this stage
        dense_items: list[tuple[str, dict[str, float]]] = []  # every non-expert matrix of this stage
        for m in mats:
            cost = _shard_cost(m, par.etp if m.expert else par.tp, tp_mode, num_ns_steps, restart_iterations)
            if m.expert:
                expert_items.extend([(m.kind, cost)] * (experts_per_rank * n_type[m.layer_type]))
            else:
                dense_items.extend([(m.kind, cost)] * (m.per_layer * n_type[m.layer_type]))
        e_bins = [_Bin() for _ in range(expert_dp if distributed == "layerwise" else 1)]
        _lpt(expert_items, e_bins)
        bins = [
            _Bin(cost=dict(e_bins[j % len(e_bins)].cost), kinds=Counter(e_bins[j % len(e_bins)].kinds))
            for j in range(dp_slots)
        ]  # expert loads tiled over the stage's DP slots
        if distributed == "layerwise":
            _lpt(dense_items, bins)
        else:
            for b in bins:
                _lpt(dense_items, [b])
        worst = max(bins, key=lambda b: b.cost["plain"])
        stages.append(
            {
                "pp_rank": rank,
                "layers": len(layer_ids),
                "dense_layers": n_type["dense"],
                "moe_layers": n_type["moe"],
                "max": dict(worst.cost),
                "mean": {c: sum(b.cost[c] for b in bins) / len(bins) for c in CONVENTIONS},
                "kinds_on_max_gpu": dict(worst.kinds),
            }
        )
        all_bins.extend(bins)
    worst_stage = max(stages, key=lambda s: s["max"]["plain"])
    return {
        "max": {c: max(b.cost[c] for b in all_bins) for c in CONVENTIONS},
        "mean": {c: sum(b.cost[c] for b in all_bins) / len(all_bins) for c in CONVENTIONS},
        "min": {c: min(b.cost[c] for b in all_bins) for c in CONVENTIONS},
        "max_pp_rank": worst_stage["pp_rank"],
        "kinds_on_max_gpu": worst_stage["kinds_on_max_gpu"],
        "stages": stages,
        "matrices": mats,
        "options": {
            "num_ns_steps": num_ns_steps,
            "split_qkv": split_qkv,
            "split_mla_kv_down": split_mla_kv_down,
            "split_gate_up": split_gate_up,
            "router_to_matrix": router_to_matrix,
            "distributed": distributed,
            "tp_mode": tp_mode,
            "restart_iterations": list(restart_iterations),
        },
    }


def ns_flops_per_step(
    mats: list[NSMatrix],
    num_ns_steps: int = 5,
    convention: str = "plain",
    *,
    restart_iterations: tuple[int, ...] = (2,),
) -> float:
    """NS FLOPs of one optimizer step, each matrix orthogonalized once (no TP duplication)."""
    return float(
        sum(
            m.count
            * ns_flops(m.rows, m.cols, num_ns_steps, convention, restart_iterations=restart_iterations)
            for m in mats
        )
    )
