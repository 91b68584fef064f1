"""Forward + backward time of one pipeline stage on one GPU, and the pipelined step around it.

Per micro-batch and GPU, each layer costs:
- GEMMs (fprop, dgrad, wgrad of every weight from `bench.flops.enumerate_ns_matrices`, plus the logits): roofline
  max(FLOPs / achievable rate, bytes / achievable HBM bandwidth), rates per precision from the hardware row and
  `constants.FITTED`; MXFP8 operands are 1 B + scales, outputs bf16, wgrad accumulates into the fp32 main_grad.
- core attention: Megatron's attn_core FLOPs (`bench.flops.model_flops_breakdown`) at the FlashAttention efficiency
  of the bf16 peak (attention stays bf16 under MXFP8).
- memory-bound activation traffic (norms, quantization, rope, activation, permutation, residuals, loss):
  `activation_bytes_per_token`, itemized below, at the achievable HBM bandwidth.
- communication that the published layouts do not overlap: MoE all-to-all (dispatch + combine, forward and
  backward; one copy per destination rank as DeepEP/HybridEP send) and TP sequence-parallel all-gather /
  reduce-scatter.
The pipelined step is the slowest stage times (1 + (pp - 1) / (vp * m)) (interleaved 1F1B bubble, m micro-batches)
plus the pipeline sends that fill and drain it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import comb

from bench import flops
from bench.tools.perfmodel import constants as C
from bench.tools.perfmodel import hwprofile, links
from muonbench.pipeline import stage_layers
from muonbench.schema import HardwareConfig, ModelConfig, ParallelismConfig, PrecisionConfig

BF16 = 2.0
FP32 = 4.0
BACKWARD_TRAFFIC = 2.0
"""Backward elementwise kernels read the saved input and the output gradient and write the input gradient (3
tensors against the forward's 2) and quantize the output gradient for dgrad and wgrad: ~2x the forward bytes."""
CE_BYTES_PER_LOGIT = 8.0
"""Cross-entropy over the (vocab-parallel) logits: bf16 logits read in forward, fp32 max/sum statistics, bf16
gradient written and read back: ~8 B per logit (Megatron vocab_parallel_cross_entropy with loss fusion)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Rates:
    """Achievable rates of one GPU."""

    gemm_flops: float
    """Linear layers at the run's precision (FLOP/s)."""
    expert_gemm_flops: float
    """Expert (grouped) linear layers at the run's precision (FLOP/s)."""
    bf16_flops: float
    attention_flops: float
    hbm: float
    """Bytes/s for memory-bound kernels."""
    operand_bytes: float
    """Bytes per GEMM operand element (MXFP8 1 + 1/32, bf16 2)."""


def rates(hw: HardwareConfig, precision: PrecisionConfig, engine: str = "megatron") -> Rates:
    """Achievable rates from the datasheet row and its efficiencies (`hwprofile.effective`: `constants.efficiency`,
    or the hardware profile's measurements); the bridge engine's memory-bound kernels run at the row's `hbm_bridge`
    where it has one."""
    eff = hwprofile.effective(hw)
    hbm = eff.hbm_bridge if engine == "bridge" and eff.hbm_bridge is not None else eff.hbm
    bf16 = hw.peak_bf16_tflops * 1e12 * eff.gemm_bf16.value
    fp8 = precision.name == "fp8_mx"
    if fp8 and hw.peak_fp8_tflops <= 0:
        raise ValueError(f"precision.name='fp8_mx' on hardware.name={hw.name!r}: the row has no FP8 peak")
    gemm = hw.peak_fp8_tflops * 1e12 * eff.gemm_fp8.value if fp8 else bf16
    grouped = gemm if fp8 or eff.gemm_grouped is None else hw.peak_bf16_tflops * 1e12 * eff.gemm_grouped.value
    return Rates(
        gemm_flops=gemm,
        expert_gemm_flops=grouped,
        bf16_flops=bf16,
        attention_flops=hw.peak_bf16_tflops * 1e12 * (eff.attention or C.ATTENTION_EFFICIENCY).value,
        hbm=hw.hbm_tbps * 1e12 * hbm.value,
        operand_bytes=C.FP8_BYTES.value if fp8 else BF16,
    )


def gemm_time(m: float, n: float, k: float, r: Rates, *, operand_bytes: float, out_bytes: float) -> float:
    """Roofline time of one (m x k) @ (k x n) GEMM."""
    flop = 2.0 * m * n * k
    nbytes = (m * k + k * n) * operand_bytes + m * n * out_bytes
    return max(flop / r.gemm_flops, nbytes / r.hbm)


def linear_time(tokens: float, out_dim: float, in_dim: float, r: Rates, *, operand_bytes: float) -> float:
    """fprop + dgrad + wgrad of a tokens x in -> out layer; wgrad accumulates into fp32 main_grad."""
    fprop = gemm_time(tokens, out_dim, in_dim, r, operand_bytes=operand_bytes, out_bytes=BF16)
    dgrad = gemm_time(tokens, in_dim, out_dim, r, operand_bytes=operand_bytes, out_bytes=BF16)
    wgrad = gemm_time(
        out_dim, in_dim, tokens, r, operand_bytes=operand_bytes, out_bytes=C.MAIN_GRAD_BYTES_PER_PARAM.value
    )
    return fprop + dgrad + wgrad


def activation_bytes_per_token(model: ModelConfig, layer_type: str, *, q8: float) -> float:
    """Forward HBM bytes per token of one layer's memory-bound kernels; `q8` = bytes of one quantized copy.

    Quantizing a bf16 tensor for a GEMM reads 2 B and writes a rowwise and a columnwise copy (TE MXFP8 keeps both
    for fprop and wgrad): 2 + 2 q8 per element; bf16 GEMMs (q8 = 0) read their input directly: no such pass.
    """
    h, k = model.hidden_size, model.moe_router_topk
    quant = BF16 + 2 * q8 if q8 > 0 else 0.0
    norm_quant = BF16 + max(2 * q8, BF16)  # fused RMSNorm + quantize (TE LayerNormLinear)
    residual = 3 * BF16  # read two streams, write one
    nh = model.num_attention_heads
    if model.attention == "mla":
        d_qk, d_rope, d_v = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        attn = (
            norm_quant * h  # input norm for q_down and kv_down
            + (BF16 + quant) * (model.q_lora_rank + model.kv_lora_rank)  # q/kv latent norms + quantize
            + 2 * BF16 * d_rope  # rope on the shared k rope rows
            + 2 * 2 * BF16 * nh * (d_qk + d_rope)  # q: split nope/rope, rope, concat (2 passes)
            + 2 * 2 * BF16 * nh * (d_qk + d_v)  # kv_up output: split k/v, concat k with rope (2 passes)
            + quant * nh * d_v  # attention output quantized for linear_proj
            + residual * h
        )
    else:
        q, kv = nh * model.kv_channels, model.num_query_groups * model.kv_channels
        attn = (
            norm_quant * h
            + 2 * 2 * BF16 * (q + kv)  # q/k RMSNorm and rope (read + write each)
            + quant * q  # attention output quantized for linear_proj
            + residual * h
        )
    g = 2 if model.gated_linear_unit else 1
    if layer_type == "dense":
        f = model.ffn_hidden_size
        return attn + norm_quant * h + (g * BF16 + BF16) * f + quant * f + residual * h
    f, e = model.moe_ffn_hidden_size, model.num_experts
    moe = (
        2 * BF16 * h  # pre-MLP RMSNorm (bf16 out: router and dispatch read it)
        + 4 * FP32 * e  # router scores, top-k, probabilities (fp32)
        + BF16 * h
        + BF16 * k * h  # dispatch: read each token, write its k copies at the receivers
        + 2 * BF16 * k * h  # permute into expert-major order
        + quant * k * h  # fc1 input quantize
        + (g * BF16 + BF16) * k * f  # SwiGLU: read gate and up, write
        + quant * k * f  # fc2 input quantize
        + 2 * BF16 * k * h  # unpermute
        + BF16 * k * h  # combine: copies land back at the source
        + BF16 * k * h
        + BF16 * h  # weighted sum of the k copies
        + residual * h
    )
    fs = model.moe_shared_expert_intermediate_size
    if fs:
        moe += quant * h + (g * BF16 + BF16) * fs + quant * fs + residual * h
    return attn + moe


def expert_copies_sent(model: ModelConfig, ep: int) -> float:
    """Expected remote EP ranks a token is sent to (one copy per rank holding >= 1 of its top-k experts)."""
    e, k = model.num_experts, model.moe_router_topk
    local = e // ep
    p_none = comb(e - local, k) / comb(e, k)
    return (ep - 1) * (1.0 - p_none)


@dataclass(kw_only=True, slots=True)
class StageTime:
    """Seconds one GPU of a pipeline stage spends per optimizer step (all its micro-batches), by term."""

    pp_rank: int
    dense_layers: int
    moe_layers: int
    terms: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.terms.values())


def stage_times(
    model: ModelConfig,
    par: ParallelismConfig,
    hw: HardwareConfig,
    precision: PrecisionConfig,
    engine: str = "megatron",
) -> list[StageTime]:
    """Per-stage forward + backward time per step (no bubble), from the stage's layer list."""
    r = rates(hw, precision, engine)
    bd = flops.model_flops_breakdown(model, tp=par.tp)
    n_layers = model.num_layers + model.mtp_num_layers
    mats = flops.enumerate_ns_matrices(model, split_qkv=False)
    tp, cp, ep, etp = par.tp, par.cp, par.ep, par.etp
    micro = par.grad_accum
    tokens = par.mbs * model.seq_length / cp  # tokens of one micro-batch on this GPU's TP group
    q8 = r.operand_bytes if precision.name == "fp8_mx" else 0.0
    tp_link = links.group_link(hw, tp)
    ep_link = links.group_link(hw, ep, stride=tp * cp)
    v_pad = flops.padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by, tp)
    out: list[StageTime] = []
    layer_lists = stage_layers(model, par)
    for rank, layer_ids in enumerate(layer_lists):
        n_dense = (
            sum(1 for i in layer_ids if i < model.num_dense_layers) if model.num_experts else len(layer_ids)
        )
        n_moe = len(layer_ids) - n_dense
        per_type = {"all": len(layer_ids), "dense": n_dense, "moe": n_moe}
        gemm = 0.0
        for m in mats:
            n_inst = per_type[m.layer_type] * (m.per_layer // ep if m.expert else m.per_layer)
            if not n_inst:
                continue
            if m.expert:
                m_tok = tokens / tp * model.moe_router_topk * etp / (model.num_experts / ep)
                out_dim, in_dim = _shard(m, etp)
            else:
                m_tok = tokens
                out_dim, in_dim = _shard(m, tp)
            ob = BF16 if m.kind == "router" else r.operand_bytes
            rm = replace(r, gemm_flops=r.expert_gemm_flops) if m.expert else r
            gemm += n_inst * linear_time(m_tok, out_dim, in_dim, rm, operand_bytes=ob)
        attn = len(layer_ids) * bd["attn_core"] / n_layers * tokens / tp / r.attention_flops
        act = (
            (
                n_dense * activation_bytes_per_token(model, "dense", q8=q8)
                + n_moe * activation_bytes_per_token(model, "moe", q8=q8)
            )
            * (1 + BACKWARD_TRAFFIC)
            * tokens
            / tp
        )
        if rank == len(layer_lists) - 1:  # output layer and loss
            gemm += linear_time(tokens, v_pad / tp, model.hidden_size, r, operand_bytes=r.operand_bytes)
            act += CE_BYTES_PER_LOGIT * tokens * v_pad / tp
        a2a = 0.0
        if n_moe and ep > 1:
            sent = tokens / tp * expert_copies_sent(model, ep) * model.hidden_size * BF16
            a2a = 4 * n_moe * links.all_to_all(sent, ep, ep_link)  # dispatch + combine, forward + backward
        tp_comm = 0.0
        if (
            tp > 1
        ):  # sequence parallel: all-gather before and reduce-scatter after attention and MLP, fwd + bwd
            buf = tokens * model.hidden_size * BF16
            tp_comm = 8 * len(layer_ids) * links.all_gather(buf, tp, tp_link)
        terms = {
            "gemm": gemm * micro,
            "attention": attn * micro,
            "activation_traffic": act / r.hbm * micro,
            "moe_all_to_all": a2a * micro,
            "tp_comm": tp_comm * micro,
        }
        out.append(StageTime(pp_rank=rank, dense_layers=n_dense, moe_layers=n_moe, terms=terms))
    return out


def _shard(m: flops.NSMatrix, tp: int) -> tuple[float, float]:
    """(out, in) of one TP shard of a weight."""
    if tp == 1 or m.tp_partition_dim < 0:
        return float(m.rows), float(m.cols)
    if m.tp_partition_dim == 0:
        return m.rows / tp, float(m.cols)
    return float(m.rows), m.cols / tp


def pipeline_time(
    model: ModelConfig,
    par: ParallelismConfig,
    hw: HardwareConfig,
    precision: PrecisionConfig,
    engine: str = "megatron",
) -> dict[str, float | list[StageTime]]:
    """Step time of forward + backward over all micro-batches: slowest stage, bubble and exposed sends."""
    stages = stage_times(model, par, hw, precision, engine)
    slowest = max(stages, key=lambda s: s.total)
    bubble = (par.pp - 1) / (par.vp * par.grad_accum)
    p2p = 0.0
    if par.pp > 1:
        link = links.group_link(hw, par.pp, stride=par.tp * par.cp * par.dp)
        act = par.mbs * model.seq_length / par.cp / par.tp * model.hidden_size * BF16
        p2p = 2 * (par.pp - 1) * links.p2p(act, link)  # fill and drain; steady-state sends overlap compute
    return {
        "stages": stages,
        "slowest": slowest,
        "bubble": bubble * slowest.total,
        "pp_p2p": p2p,
        "total": slowest.total * (1 + bubble) + p2p,
    }
