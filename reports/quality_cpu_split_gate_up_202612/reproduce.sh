#!/usr/bin/env bash
# Split vs joint gate/up Muon (and AdamW as the target) on the cpu quality profile, 3 seeds. About 30 minutes on
# 2 cores. Writes $OUT/ (seed 1234) and $OUT/seed1235, $OUT/seed1236 (README.md, results.csv, trials.csv, run.json,
# plots); the seed-1234 README is the one this folder keeps as seed1234.md.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PY:-.venv/bin/python}
OUT=${OUT:-reports/quality_cpu_split_gate_up_local}
$PY -m bench.tools.quality profile=cpu optimizers=adamw,muon,muon_split_gate_up out="$OUT"
for seed in 1235 1236; do
    $PY -m bench.tools.quality profile=cpu seed=$seed optimizers=adamw,muon,muon_split_gate_up out="$OUT/seed$seed"
done
