#!/usr/bin/env bash
# Megatron-Bridge's own pretrain loop on one GPU (H200 measured): AdamW, ours (Muon) and Megatron's built-in Muon on
# the FLOP-matched Qwen3-30B-A3B slice (8 steps, 4 warm-up), then the megatron engine on the same slice with
# Transformer Engine layers, without and with Bridge's permute and RoPE fusions; last, the engine with every Bridge
# setting it has an option for, and Bridge AdamW, in crossover order.
# Needs Transformer Engine + Megatron-Bridge 0.6.2 + Megatron-Core 0.19.2 (the NeMo image built by `make docker-build
# PLATFORM=linux/amd64`, or `bench/tools/install_bridge_stack.sh WHEELS` then PYTHONPATH=/tmp/site). About 32 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python}
$PY -m bench.tools.project experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu optimizer=muon   # the prediction
$PY -m bench.run -m experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu optimizer=adamw,muon,muon_megatron
$PY -m bench.run -m experiment=h200/qwen3_30b_a3b_slice_flops_adamw_1gpu engine.layers=te \
    engine.moe_permute_fusion=false,true engine.apply_rope_fusion=false
$PY -m bench.run experiment=h200/qwen3_30b_a3b_slice_flops_adamw_1gpu engine.layers=te \
    engine.moe_permute_fusion=true engine.apply_rope_fusion=true
BRIDGE_SETTINGS="engine.layers=te engine.moe_permute_fusion=true engine.apply_rope_fusion=true \
    engine.moe_router_fusion=true engine.moe_router_dtype=none engine.grad_reduce_in_fp32=false"
for _ in 1 2; do
    $PY -m bench.run experiment=h200/qwen3_30b_a3b_slice_flops_adamw_1gpu $BRIDGE_SETTINGS bench.steps=8 bench.warmup_steps=2
    $PY -m bench.run experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu optimizer=adamw
done
$PY -m bench.results.collect && $PY -m bench.results.report
