"""Every constant of the performance model, each with its source.

Three kinds: datasheet rows (conf/hardware/*.yaml, read through `HardwareConfig`), our own H200 measurements
(docs/references.md#h200-baseline), and values taken from papers or public
benchmarks. A fitted value's source starts with FITTED and names the runs or published rows it was fitted to: GB300
has one (the memory-bound fraction, on Table 1), H200 three, one per term (the Megatron-core engine's memory-bound
fraction, the Bridge engine's, and the optimizer step's element-wise fraction); B200 and H100 borrow them.
"""

from __future__ import annotations

from dataclasses import dataclass

from muonbench import engines
from optim import cost


@dataclass(frozen=True, kw_only=True, slots=True)
class Sourced:
    """A number and where it comes from."""

    value: float
    source: str


# --------------------------------------------------------------------------------------------------------------
# Our H200 measurements (docs/references.md#h200-baseline)
# --------------------------------------------------------------------------------------------------------------
H200_PEAK_BF16_TFLOPS: float = cost.GEMM_CEILINGS["nvidia_h200"]["datasheet_bf16_tflops"]
H200_GEMM_CEILING_TFLOPS = Sourced(
    value=cost.GEMM_CEILINGS["nvidia_h200"]["bf16_tflops"], source=cost.GEMM_CEILINGS["nvidia_h200"]["source"]
)
HBM_EFFICIENCY = Sourced(
    value=0.72,
    source="our H200: torch.optim.AdamW(fused=True) on 622.9 M fp32 params in 5.01 ms, 28 B/param "
    "(param, grad, m, v read; param, m, v written) = 3.48 TB/s of 4.8 TB/s datasheet (docs/references.md#h200-baseline)",
)
NS_CALL_HOST_MS = Sourced(
    value=0.33,
    source="our H200: one EO newton_schulz call (5 steps) on 512x2048 (12 GFLOP, GPU floor 0.017 ms) takes "
    "0.330 ms: the host cost of one NS call when the GPU is idle (docs/references.md#h200-baseline)",
)
NS_CALL_FIXED_LAUNCHES = Sourced(
    value=5.0,
    source="EO muon_utils.newton_schulz v0.3.0: normalize (norm, clamp, divide), cast to bf16, cast back; plus "
    "3 launches per step (X X^T, addmm, addmm): 20 launches at 5 steps, so 16.5 us per launch",
)
EO_MUON_PARAM_HOST_MS = Sourced(
    value=0.755,
    source="our H200: EO Muon v0.3.0 optimizer.step() on one Qwen3 layer, 260 matrices in 196.4 ms, nearly all "
    "launch-bound (GPU floor 30.8 ms): 0.755 ms per matrix for the whole per-parameter Python loop "
    "(weight decay, momentum, Nesterov, NS, scale, update) (docs/references.md#h200-baseline). Not used by the model (the "
    "published profile charges one NS call per matrix, NS_CALL_HOST_MS); the calibration report shows "
    "what it would predict",
)
NS_BATCHED_EXTRA_MS = Sourced(
    value=0.0,
    source="one batched 3-D NS call costs the same host time as a 2-D one (same kernel count); "
    "optim.distributed.assignment.CostModel fixed_ms covers it",
)

# --------------------------------------------------------------------------------------------------------------
# Papers and public benchmarks
# --------------------------------------------------------------------------------------------------------------
FP32_NS_RATE_FRACTION = Sourced(
    value=67.0 / 989.0,
    source="NVIDIA H200 datasheet: FP32 67 TFLOP/s against dense BF16 989 (docs/references.md#hardware-peaks); "
    "ns_precision=fp32 iterates at 'highest' precision (no TF32, no tensor cores), so its NS GEMMs run at this "
    "fraction of the bf16 rate; applied to every hardware row",
)
ATTENTION_EFFICIENCY = Sourced(
    value=0.5,
    source="FlashAttention-3 (arXiv 2407.08608): forward up to 75% of H100 bf16 peak; pytorch/benchmark #2391 "
    "measured FA3 forward at 590 TF/s (60%) for seq 4096, head dim 128; the backward pass runs lower, "
    "so 0.5 of the dense bf16 peak for forward + backward, causal",
)
NVLINK_EFFICIENCY = Sourced(
    value=cost.LINK_EFFICIENCY,
    source="nccl-tests on GB200 MNNVL, 2 nodes x 4 GPUs: 811 GB/s bus bandwidth of 900 GB/s per direction "
    "(lixueduan.com/posts/ai/13-gb200-mnnvl-nccl-test)",
)
NETWORK_EFFICIENCY = Sourced(
    value=cost.LINK_EFFICIENCY,
    source="nccl-tests bus bandwidth of RDMA NICs at large messages: ~90% of line rate (same source family "
    "as NVLINK_EFFICIENCY)",
)
A2A_EFFICIENCY = Sourced(
    value=0.9,
    source="DeepEP README (deepseek-ai/DeepEP): intranode NVLink dispatch 153 GB/s and combine 158 GB/s of "
    "~160 GB/s on H800; HybridEP is the same design for NVL72; we keep 0.9 like NCCL",
)
NVLINK_LATENCY_US = Sourced(
    value=cost.NVLINK_LATENCY_US, source="NVLink 5 small-message collective latency, a few us (nccl-tests)"
)
NETWORK_LATENCY_US = Sourced(
    value=cost.NETWORK_LATENCY_US, source="RDMA all-reduce latency across nodes, ~5-10 us (nccl-tests)"
)
BUCKET_ELEMENTS = Sourced(
    value=40e6, source="MCore DistributedDataParallelConfig.bucket_size default: max(40M, 1M x DP) elements"
)
GRAD_BYTES = Sourced(
    value=2.0, source="MCore DDP grad_reduce_in_fp32 default False: gradients reduced in bf16"
)
PARAM_GATHER_BYTES = Sourced(value=2.0, source="bf16 parameters all-gathered (1 B with MXFP8 param gather)")
ADAMW_BYTES_PER_PARAM = Sourced(
    value=30.0,
    source="distributed fused Adam with fp32 master weights: grad 4 read, master/m/v 12 read + 12 written, "
    "bf16 param 2 written (MCore DistributedOptimizer)",
)
MUON_ELEMENTWISE_BYTES_PER_PARAM = Sourced(
    value=44.0,
    source="Muon update outside NS: grad 4 read, momentum 4 read + 4 written, Nesterov input 4 written + 4 read, "
    "bf16 cast 2 written, NS output 4 written + 4 read, master 4 read + 4 written, bf16 param 2 written "
    "(EO Muon v0.3.0 step, docs/references.md#emerging-optimizers)",
)
MAIN_GRAD_BYTES_PER_PARAM = Sourced(
    value=8.0,
    source="wgrad accumulated into the fp32 main_grad each micro-batch: 4 B read + 4 B written "
    "(MCore gradient_accumulation_fusion)",
)
FP8_BYTES = Sourced(
    value=1.0 + 1.0 / 32, source="MXFP8: 1 B per element + one E8M0 scale per 32 (OCP MX spec)"
)


# --------------------------------------------------------------------------------------------------------------
# Per-hardware efficiencies: at most ONE fitted value per row and engine, named and justified here
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class HardwareEfficiency:
    """Achievable fractions of a hardware row's datasheet peaks."""

    gemm_bf16: Sourced
    gemm_fp8: Sourced
    hbm: Sourced
    """Achieved fraction of the HBM datasheet bandwidth in memory-bound kernels (activations, optimizer)."""
    eo_loop_ms: Sourced
    """Host milliseconds per matrix of the published per-matrix NS loop (EO newton_schulz inside Megatron's Muon)
    on this row's host, when the GPU work is shorter (launch-bound)."""
    optimizer_hbm: Sourced | None = None
    """`hbm` for the Muon step's element-wise kernels (fused, few large tensors: closer to a standalone kernel's
    bandwidth than the forward-backward's); None: `hbm` stands in. AdamW's step keeps `hbm`."""
    hbm_bridge: Sourced | None = None
    """`hbm` for the forward-backward of Megatron-Bridge's own loop (Transformer Engine's fused router, bf16
    gradient buffers, TE cross-entropy, CUDA graphs); None: no Bridge fit on this row, and `hbm` stands in."""
    gemm_grouped: Sourced | None = None
    """bf16 expert (grouped) GEMMs' fraction of the bf16 peak; None: `gemm_bf16` stands in (a hardware profile
    measures it: `hwprofile`)."""
    attention: Sourced | None = None
    """Core attention's fraction of the bf16 peak; None: `ATTENTION_EFFICIENCY` (a hardware profile measures it)."""


_H200_BF16 = Sourced(
    value=H200_GEMM_CEILING_TFLOPS.value / H200_PEAK_BF16_TFLOPS,
    source=f"our H200 GEMM ceiling {H200_GEMM_CEILING_TFLOPS.value:g} / {H200_PEAK_BF16_TFLOPS:g} TF/s datasheet "
    "(docs/references.md#h200-baseline)",
)
_X86_HOST = Sourced(
    value=0.755,
    source="our H200 (x86 HGX host), per matrix inside a real optimizer step: EO Muon 196.4 ms / 260 matrices = "
    "0.755 ms (docs/references.md#h200-baseline); other in-situ measurements 0.486 (kernel run, EO step, 126.3 ms / 260) and "
    "0.785 (Megatron built-in Muon, 1.22 s NS / 1,554 matrices, reports/megatron_h200_202611): the middle one",
)
_GRACE_HOST = Sourced(
    value=0.33,
    source="no GB300 (Grace) host measurement: the lowest EO NS call we measured anywhere (isolated call on the "
    "H200 host, NS_CALL_HOST_MS); Table 1's Qwen3 Muon row needs <= ~0.21 ms per matrix on that node",
)
_GEMM_FRACTION_ASSUMED = (
    f"no measurement on this GPU: our H200 bf16 GEMM ceiling fraction "
    f"{H200_GEMM_CEILING_TFLOPS.value:g}/{H200_PEAK_BF16_TFLOPS:g} assumed"
)

# The GB300 row's one fitted value is `hbm`: the bandwidth that the training step's memory-bound kernels achieve.
# Both published GB300 runs spend more time in them than in GEMMs (Qwen3-30B-A3B's small hidden and expert widths
# above all), so it is the value Table 1 constrains (the AdamW rows fix it; the Muon rows only add the optimizer
# terms). Fitted minimax over all four rows; GEMM fractions keep our H200 measurement.
H200_HBM_FIT = 0.245  # rounded fit_h200_hbm() (reports/perfmodel_gb300_202611, Single-H200 checks)
_H200_HBM = Sourced(
    value=H200_HBM_FIT,
    source="FITTED (the row's value for the megatron engine's forward-backward) on one single-H200 Megatron run, "
    "reports/megatron_h200_202611/20261129_h200_06a7769/qwen_adamw (TE-free engine: torch grouped_mm experts, SDPA "
    "attention, unfused norms; bench.tools.perfmodel.calibrate.fit_h200_hbm); a standalone fused AdamW kernel "
    "reaches 0.72 (HBM_EFFICIENCY), the engine's memory-bound kernels average far less",
)
H200_BRIDGE_HBM_FIT = 0.36  # rounded fit_h200_bridge_hbm() (docs/perfmodel.md#megatron-bridge)
_H200_BRIDGE_HBM = Sourced(
    value=H200_BRIDGE_HBM_FIT,
    source="FITTED (the row's one value for the bridge engine) on the Bridge runs of one model, OLMoE-1B-7B as a "
    "4-layer slice, AdamW and Muon 3 runs each in crossover on one H200 (bench/tools/perfmodel/data/"
    "bridge_h200_runs.json; bench.tools.perfmodel.calibrate.fit_h200_bridge_hbm, minimax over the two "
    "optimizers' median steps)",
)
H200_OPTIMIZER_HBM_FIT = 0.62  # rounded fit_h200_optimizer_hbm() (reports/perfmodel_gb300_202611)
_H200_OPTIMIZER_HBM = Sourced(
    value=H200_OPTIMIZER_HBM_FIT,
    source="FITTED (the row's one value for the optimizer step) on the optimizer steps of the committed Muon runs whose "
    "NS plan times were measured (bench/tools/perfmodel/data/gpu_runs.json; "
    "bench.tools.perfmodel.calibrate.fit_h200_optimizer_hbm, minimax); between the engine's fitted fraction and the "
    "standalone fused AdamW's 0.72 (HBM_EFFICIENCY)",
)
GB300_HBM_FIT = 0.475  # rounded fit_gb300_hbm() (reports/perfmodel_gb300_202611/README.md)
FITTED: dict[str, HardwareEfficiency] = {
    "gb300": HardwareEfficiency(
        gemm_bf16=Sourced(value=_H200_BF16.value, source=_GEMM_FRACTION_ASSUMED),
        gemm_fp8=Sourced(
            value=_H200_BF16.value, source=_GEMM_FRACTION_ASSUMED + " for MXFP8 of the FP8 peak"
        ),
        hbm=Sourced(
            value=GB300_HBM_FIT,
            source="FITTED (the one fitted value of this row) to NVIDIA blog Table 1, minimax over its four "
            "model-TF rows (Kimi K2 256 GB300: 1,051 / 1,029; Qwen3-30B-A3B 8 GB300: 713 / 686), "
            "bench.tools.perfmodel.calibrate.fit_gb300_hbm",
        ),
        eo_loop_ms=_GRACE_HOST,
    ),
    "b200": HardwareEfficiency(
        gemm_bf16=Sourced(value=_H200_BF16.value, source=_GEMM_FRACTION_ASSUMED),
        gemm_fp8=Sourced(value=_H200_BF16.value, source=_GEMM_FRACTION_ASSUMED + " for FP8"),
        hbm=Sourced(
            value=GB300_HBM_FIT, source="no B200 fit: the GB300 fit (same 8 TB/s HBM3e, same kernels)"
        ),
        eo_loop_ms=_X86_HOST,
    ),
    "h200": HardwareEfficiency(
        gemm_bf16=_H200_BF16,
        gemm_fp8=Sourced(value=_H200_BF16.value, source=_GEMM_FRACTION_ASSUMED + " for FP8"),
        hbm=_H200_HBM,
        eo_loop_ms=_X86_HOST,
        optimizer_hbm=_H200_OPTIMIZER_HBM,
        hbm_bridge=_H200_BRIDGE_HBM,
    ),
    "h100": HardwareEfficiency(
        gemm_bf16=Sourced(
            value=_H200_BF16.value, source="same Hopper die as H200: its measured ceiling fraction"
        ),
        gemm_fp8=Sourced(value=_H200_BF16.value, source=_GEMM_FRACTION_ASSUMED + " for FP8"),
        hbm=Sourced(
            value=H200_HBM_FIT, source="no H100 run: the H200 fit (same Hopper memory system, same engine)"
        ),
        eo_loop_ms=_X86_HOST,
    ),
}


CALIBRATED: dict[tuple[str, str], str] = {
    ("h200", "megatron"): "the H200 row's memory-bound fraction is fitted on a single-H200 Megatron-core engine run "
    "(reports/megatron_h200_202611)",
    ("h200", "bridge"): "the H200 row's Bridge memory-bound fraction is fitted on one model's Bridge runs on one H200; "
    "hosts of one GPU kind have differed by more than the fit's error (docs/perfmodel.md#megatron-bridge)",
    ("gb300", "bridge"): "the GB300 row's memory-bound fraction is fitted on NVIDIA's published Megatron-Bridge "
    "throughput (Table 1: 4 rows, 2 workloads; reports/perfmodel_gb300_202611)",
}
"""(hardware row, engine) -> what the row's fitted value for that engine was fitted on; every other pair is not
calibrated."""


def engine_calibration(engine: str, hardware_name: str) -> str:
    """What a prediction of `engine` on `hardware_name` rests on, in a line starting "calibrated" or "not
    calibrated" (docs/perfmodel.md)."""
    fitted = CALIBRATED.get((hardware_name, engine))
    if fitted is not None:
        return f"calibrated: {fitted}"
    if not engines.spec(engine).megatron_core:
        return f"not calibrated: the model describes Megatron-core's step, not the {engine} engine's"
    stands_in = [hw for (hw, e) in CALIBRATED if e == engine]
    if hardware_name in {hw for hw, _ in CALIBRATED}:
        return (
            f"not calibrated: no {engine}-engine fit on {hardware_name}; the row's fit for another engine stands in"
        )
    return (
        f"not calibrated: no run on {hardware_name} was ever fitted; its efficiencies are assumed from "
        f"{', '.join(stands_in) or 'other rows'} (constants.FITTED['{hardware_name}'])"
    )


def efficiency(hardware_name: str) -> HardwareEfficiency:
    """Efficiencies of a hardware row; ValueError for a row without any (e.g. `cpu`)."""
    if hardware_name not in FITTED:
        raise ValueError(f"hardware.name={hardware_name!r}: the performance model knows {sorted(FITTED)}")
    return FITTED[hardware_name]
