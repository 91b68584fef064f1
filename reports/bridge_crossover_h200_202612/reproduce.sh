#!/usr/bin/env bash
# Bridge's own pretrain loop on one H200, the FLOP-matched Qwen3-30B-A3B slice: AdamW and ours (Muon) in crossover
# order on one host, 6 steps each (3 warm-up: Bridge captures the router's CUDA graphs in iteration 3), then the
# crossover analysis. Needs the Bridge stack (bench/tools/install_bridge_stack.sh WHEELS, then PYTHONPATH=/tmp/site)
# and an idle host: let a minute pass after any build or install. About 4 minutes per run.
# ORDER="adamw muon muon adamw adamw muon" (the default) gives three full pairs, as the committed runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python}
OUT=${OUT:-runs/bridge_crossover}
for opt in ${ORDER:-adamw muon muon adamw adamw muon}; do
    $PY -m bench.run experiment=h200/qwen3_30b_a3b_slice_flops_bridge_1gpu optimizer="$opt" bench.steps=6 \
        bench.warmup_steps=3 bench.out_dir="$OUT"
done
$PY -m bench.tools.crossover "$OUT" --out "$OUT"
