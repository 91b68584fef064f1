#!/usr/bin/env bash
# Time to AdamW's final validation loss: AdamW, Muon, MOP, SOAP-REKLS on stdlib text, cpu profile. About 15 minutes
# on 2 cores. Writes $OUT/README.md, results.csv, trials.json, loss_curves.png.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PY:-.venv/bin/python}
OUT=${OUT:-reports/quality_cpu_local}
$PY -m tools.quality profile=cpu out="$OUT"
