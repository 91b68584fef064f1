#!/usr/bin/env bash
# FLOP-matched Qwen3-30B-A3B slice on one H200 (Megatron-core engine) with QuACK's products in the NS plan: the
# November protocol (reports/megatron_h200_flops_202611/reproduce.sh: AdamW, Muon joint fc1 and split gate/up with the
# fp16 iterate, AdamW again) with quack-kernels importable. Needs one GPU with >= 120 GB, the megatron extra
# (Megatron-core 0.19.2) and the quack extra (quack-kernels 0.6.5 with nvidia-cutlass-dsl 4.8.1; installed with
# --target, put it and its nvidia_cutlass_dsl/dsl_packages on PYTHONPATH). About 10 minutes.
# Writes runs/$NAME/ (run records) and reports/$NAME/ (results.csv, steps.csv, report.md, plots).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PY:-.venv/bin/python}
$PY -c 'import quack' || { echo "quack-kernels is not importable: the plan would run without QuACK" >&2; exit 1; }
PY=$PY bash reports/megatron_h200_flops_202611/reproduce.sh
