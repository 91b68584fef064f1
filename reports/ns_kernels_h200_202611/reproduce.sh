#!/usr/bin/env bash
# Newton-Schulz per shape and one layer's optimizer step: ours vs emerging-optimizers 0.3.0 vs torch.optim.Muon.
# Needs one GPU and the test extra (emerging-optimizers). About 2 minutes.
# Writes $OUT/README.md, results.csv, results.json, ns.png, ns_plan.json.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PY:-.venv/bin/python}
OUT=${OUT:-reports/ns_kernels_local}
$PY -m bench.tools.ns_kernels out="$OUT" eo_syrk=none
