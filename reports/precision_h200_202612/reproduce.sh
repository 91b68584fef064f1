#!/usr/bin/env bash
# The cases of this report on one GPU, each a `muonbench compare` (bench.tools.compare) that stops once its interval's
# half-width is at most 0.005 or its budget is spent, then the report from the case folders. The Bridge cases need
# the Bridge stack (bench/tools/install_bridge_stack.sh WHEELS, then PYTHONPATH=/tmp/site). Writes to OUT (default
# runs/precision_h200): the committed cases/ are the record, reproduced, not overwritten. CASES="moe_megatron aa_megatron"
# runs some of them. BUDGET is each case's budget in minutes (default 15).
set -uo pipefail  # a case that fails leaves its folder; the next one still runs
HERE="$(cd "$(dirname "$0")" && pwd)"
cd "$HERE/../.."
PY=${PY:-python}
OUT=${OUT:-runs/precision_h200}
BUDGET=${BUDGET:-15}
declare -A CASE=(
    [moe_megatron]="experiment=h200/qwen3_moe_short_megatron_1gpu"
    [aa_megatron]="experiment=h200/qwen3_moe_short_megatron_1gpu --variant adamw"
    [moe_bridge]="experiment=h200/qwen3_moe_short_bridge_1gpu"
    [dense_bridge]="experiment=h200/hf_slice_short_bridge_1gpu model=hf:reports/byo_models_h200_202612/models/qwen3_8b"
)
for c in ${CASES:-moe_megatron aa_megatron moe_bridge dense_bridge}; do
    # shellcheck disable=SC2086  # the case's arguments are words
    $PY -m bench.tools.compare ${CASE[$c]} --budget-min "$BUDGET" --out "$OUT/cases/$c"
done
cp "$HERE/README.md" "$OUT/README.md"
$PY -m bench.tools.precision_report "$OUT"
