#!/usr/bin/env bash
# NCCL correctness of the TP NS modes and the layer-wise optimizer, and the layer-wise Muon step of one
# Qwen3-30B-A3B layer at 1..NGPU GPUs. Needs NGPU (default 2) GPUs of one host. About 3 minutes.
# Writes $OUT/world<n>/ (JSON per world size) and prints the tables.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PY:-.venv/bin/python}
NGPU=${NGPU:-2}
OUT=${OUT:-runs/multi_gpu_local}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
MUONBENCH_TEST_WORLD=$NGPU $PY -m pytest -q -m gpu tests/gpu/test_dist_nccl.py
for n in $(seq 1 "$NGPU"); do
    $PY -m torch.distributed.run --nproc_per_node="$n" -m bench.tools.optim_scaling strategies=lpt_cost format=json \
        out="$OUT/world$n"
done
