#!/usr/bin/env bash
# Symmetric-kernel configs and the NS iterate dtype (bf16 / fp16) on the FLOP-matched Qwen3 slice's NS problems.
# Needs one GPU. About 3 minutes. Writes $OUT/README.md, results.json, ns_plan.json.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PY:-.venv/bin/python}
OUT=${OUT:-reports/ns_tiles_local}
$PY -m experiments.ns_tiles.ns_tiles plan=reports/megatron_h200_flops_202611/ns_plan_qwen3_slice_h200.json out="$OUT"
