#!/usr/bin/env bash
# FLOP-matched Qwen3-30B-A3B slice on one H200 (Megatron-core engine): AdamW, Muon joint fc1, Muon split gate/up.
# Needs one GPU with >= 120 GB and the megatron extra (Megatron-core 0.19.2). About 8 minutes.
# Writes runs/$NAME/ (run records) and reports/$NAME/ (results.csv, steps.csv, report.md, plots).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PY:-.venv/bin/python}
NAME=${NAME:-megatron_h200_flops_local}
COMMON="bench.steps=4 bench.warmup_steps=1 bench.out_dir=runs/$NAME"
$PY -m bench.run experiment=h200/qwen3_30b_a3b_slice_flops_adamw_1gpu $COMMON
$PY -m bench.run -m experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu optimizer=muon,muon_split_gate_up \
    optimizer.ns_precision=fp16 $COMMON
$PY -m bench.run experiment=h200/qwen3_30b_a3b_slice_flops_adamw_1gpu $COMMON
$PY -m bench.results.collect --runs runs/$NAME --name $NAME
$PY -m bench.results.report --name $NAME
