#!/usr/bin/env bash
# Session 5, call 4 on nvidia-h200-x2 (call O), the last ~290 s of the session's device time: issue 11's NCCL
# correctness (tests/gpu/test_dist_nccl.py: TP NS modes and the layer-wise optimizer over NCCL on 2 GPUs equal the
# one-GPU results) and the layer-wise optimizer step of one Qwen3-30B-A3B layer at 1 and 2 GPUs (lpt_cost).
# Run from the repo root, .whl_megatron carried, as `bash reports/device_calls/h200x2_s5_call4.sh` (as it was run; with
# `MUONBENCH_GIT_SHA=<short sha>` in front the scaling record would name the commit).
set -u
source reports/device_calls/device_env.sh
mkdir -p "$OUT/x2"
{ nvidia-smi --query-gpu=index,name,driver_version --format=csv; nvidia-smi topo -m; } > "$OUT/x2/env.txt" 2>&1
timeout 80 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_dist_nccl.py > "$OUT/x2/nccl_tests.log" 2>&1
echo "pytest rc=$? t=${SECONDS}s" >> "$OUT/x2/nccl_tests.log"; grep -h "PASSED\|FAILED\|ERROR\|passed\|failed\|rc=" "$OUT/x2/nccl_tests.log" | tail -30
for n in 1 2; do
  timeout 40 python3 -m torch.distributed.run --standalone --nproc_per_node=$n -m bench.optim_scaling \
      strategies=lpt_cost out="$OUT/x2" >> "$OUT/x2/scaling.log" 2>&1
  echo "n=$n rc=$? t=${SECONDS}s" >> "$OUT/x2/scaling.log"
done
tail -12 "$OUT/x2/scaling.log"
