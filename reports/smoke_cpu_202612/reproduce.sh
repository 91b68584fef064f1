#!/usr/bin/env bash
# The pipeline end to end on CPU: AdamW vs Muon on the tiny Qwen3-MoE proxy, 2 gloo ranks (make bench). ~20 s.
# Writes runs/$NAME/ and reports/$NAME/ (results.csv, steps.csv, report.md, plots).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PY:-.venv/bin/python}
NAME=${NAME:-smoke_cpu_local}
$PY -m bench.run -m optimizer=adamw,muon experiment=cpu/qwen3_moe_tiny_dp2 bench.out_dir=runs/$NAME
$PY -m bench.results.collect --runs runs/$NAME --name $NAME
$PY -m bench.results.report --name $NAME
