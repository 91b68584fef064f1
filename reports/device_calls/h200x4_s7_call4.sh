#!/usr/bin/env bash
# Session 7, call 4 (call W) on nvidia-h200-x4, the first four-GPU machine lent; ~220 s of device time were left.
# Issue 11 (ended blocked for lack of GPUs): the layer-wise Muon step of one Qwen3-30B-A3B layer at 4 GPUs, and at 1 on
# the same host (calls R had 1 and 2 on another host: 48.5 / 34.3 ms); then the NCCL tests at 4 ranks.
# Predicted: NS per rank 30.5 / 4 ~ 7.8 ms, reduce-scatter and gather ~ as at 2 (9 + 6 ms), step ~25-28 ms (1.8-1.9x).
# Run from the repo root, .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200x4_s7_call4.sh`.
set -u
source reports/device_calls/device_env.sh
export TRITON_CACHE_DIR=/tmp/triton
mkdir -p "$TRITON_CACHE_DIR" "$OUT/x4"
{ nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv; nvidia-smi topo -m; nproc; } > "$OUT/x4/env.txt" 2>&1
for n in 4 1; do
  timeout 75 python3 -m torch.distributed.run --standalone --nproc_per_node=$n -m bench.optim_scaling \
      strategies=lpt_cost out="$OUT/x4" >> "$OUT/x4/scaling.log" 2>&1
  echo "n=$n rc=$? t=${SECONDS}s" | tee -a "$OUT/x4/scaling.log"
done
MUONBENCH_TEST_WORLD=4 timeout 50 python3 -m pytest -q -p no:cacheprovider -rA tests/gpu/test_dist_nccl.py > "$OUT/x4/nccl_tests.log" 2>&1
echo "nccl pytest rc=$? t=${SECONDS}s" | tee -a "$OUT/x4/nccl_tests.log"; grep -h "passed\|failed" "$OUT/x4/nccl_tests.log" | tail -2
grep -h "^[0-9] |" "$OUT/x4/scaling.log"
echo "done t=${SECONDS}s"
