#!/usr/bin/env bash
# Two models that have no file under conf/model, read from their Hugging Face config.json (models/), as one-GPU
# slices of four layers on one H200: AdamW vs Muon (ours) through the Megatron-core engine and through
# Megatron-Bridge's own loop, each in crossover order, then the predictions and the report.
# Needs the Bridge stack (bench/tools/install_bridge_stack.sh WHEELS, then PYTHONPATH=/tmp/site) and an idle host.
# MODELS="llama3_8b" runs one model; MODELS=qwen3_8b runs a dense Qwen3-8B slice, a model the Bridge term of the
# performance model was not fitted on. MEGATRON_ORDER / BRIDGE_ORDER replace a model's orders. About 8 minutes for
# Llama, 12 for OLMoE.
set -uo pipefail  # a failed run is recorded as such; the next one still runs
HERE="$(cd "$(dirname "$0")" && pwd)"
cd "$HERE/../.."
PY=${PY:-python}
RUNS=${RUNS:-runs/byo_models}
declare -A SLICE=(
    [llama3_8b]="model.num_layers=4 parallelism.gbs=32"
    [olmoe_1b_7b]="model.num_layers=4 parallelism.gbs=64"
    [qwen3_8b]="model.num_layers=4 parallelism.gbs=32"
)
declare -A MEGATRON=([llama3_8b]="adamw muon" [olmoe_1b_7b]="muon adamw adamw muon" [qwen3_8b]="adamw muon")
declare -A BRIDGE=(
    [llama3_8b]="adamw muon muon adamw" [olmoe_1b_7b]="adamw muon muon adamw adamw muon"
    [qwen3_8b]="adamw muon muon adamw"
)
for model in ${MODELS:-llama3_8b olmoe_1b_7b}; do
    spec="model=hf:$HERE/models/$model"
    for opt in ${MEGATRON_ORDER:-${MEGATRON[$model]}}; do
        $PY -m bench.run experiment=h200/hf_slice_megatron_1gpu "$spec" ${SLICE[$model]} optimizer="$opt" \
            bench.out_dir="$RUNS/$model/megatron"
    done
    for opt in ${BRIDGE_ORDER:-${BRIDGE[$model]}}; do
        $PY -m bench.run experiment=h200/hf_slice_bridge_1gpu "$spec" ${SLICE[$model]} optimizer="$opt" \
            bench.out_dir="$RUNS/$model/bridge"
    done
done
[ "${REPORT:-1}" = 0 ] || $PY -m bench.tools.byo_report "$RUNS" --out "$HERE"
