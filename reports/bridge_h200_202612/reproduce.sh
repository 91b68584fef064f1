#!/usr/bin/env bash
# Megatron-Bridge's own pretrain loop on one GPU (H200 measured): AdamW, ours (Muon) and Megatron's built-in Muon on
# the FLOP-matched Qwen3-30B-A3B slice, then the megatron engine on the same slice with Transformer Engine layers.
# Needs Transformer Engine + Megatron-Bridge 0.6.2 + Megatron-Core 0.19.2 (the NeMo image built by `make docker-build
# PLATFORM=linux/amd64`, or `tools/install_bridge_stack.sh WHEELS` then PYTHONPATH=/tmp/site). About 12 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python}
$PY -m tools.project experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu optimizer=muon   # the prediction
$PY -m bench.run -m experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu optimizer=adamw,muon,muon_megatron
$PY -m bench.run -m experiment=h200/qwen3_30b_a3b_slice_flops_adamw_1gpu,h200/qwen3_30b_a3b_slice_flops_muon_1gpu \
    engine.layers=te
$PY -m bench.collect && $PY -m bench.report
