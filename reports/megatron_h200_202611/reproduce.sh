#!/usr/bin/env bash
# 64-sequence Qwen3-30B-A3B slice on one H200 (Megatron-core engine): AdamW, Muon (ours), Megatron's built-in Muon.
# Needs one GPU with >= 120 GB and Megatron-core 0.19.2. About 4 minutes.
# Writes runs/$NAME/ and reports/$NAME/ (results.csv, steps.csv, report.md, plots).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PY:-.venv/bin/python}
NAME=${NAME:-megatron_h200_local}
COMMON="bench.steps=4 bench.warmup_steps=1 bench.out_dir=runs/$NAME"
$PY -m bench.run experiment=h200/qwen3_30b_a3b_slice_adamw_1gpu $COMMON
$PY -m bench.run -m experiment=h200/qwen3_30b_a3b_slice_muon_1gpu optimizer=muon,muon_megatron $COMMON
$PY -m bench.results.collect --runs runs/$NAME --name $NAME
$PY -m bench.results.report --name $NAME
