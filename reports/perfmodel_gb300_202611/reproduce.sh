#!/usr/bin/env bash
# Performance model: calibration on NVIDIA's Table 1, GB300 predictions and sweeps. CPU only, seconds.
# Writes $OUT/README.md, results.csv and the sweep plots.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PY:-.venv/bin/python}
OUT=${OUT:-reports/perfmodel_local}
$PY -m bench.tools.project report="$OUT"
