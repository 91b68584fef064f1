#!/usr/bin/env bash
# Session 7, call 3 (call V) on nvidia-h200-x2.
# Issue 7: the split gate / up lever side by side with the joint fc1 in ONE call, each on both GPUs: round 1 ours-joint on
# GPU0 (GPU1 runs the whole GPU test suite meanwhile), round 2 ours-split GPU0 / ours-joint GPU1, round 3 AdamW GPU0 /
# ours-split GPU1. Predicted: split - joint = NS 0.175 -> 0.110 s, step -60 to -70 ms (+0.3% model TFLOP/s) on each
# GPU. Then the NCCL tests on both GPUs.
# Run from the repo root, .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200x2_s7_call3.sh`.
set -u
source reports/device_calls/device_env.sh
export TRITON_CACHE_DIR=/tmp/triton
mkdir -p "$TRITON_CACHE_DIR" "$OUT/x2"
{ nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv; nproc; } > "$OUT/mg/env.txt" 2>&1
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs --case-timeout-s 170"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=4 bench.warmup_steps=1 bench.microbatch_times=true bench.moe_load_stats=true"
J="optimizer.ns_precision=fp16"
S="optimizer.ns_precision=fp16 optimizer.split_gate_up=true"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv -lms 1000 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
(CUDA_VISIBLE_DEVICES=1 timeout 280 python3 -m pytest -q -p no:cacheprovider -rA tests/gpu/test_kernels_gpu.py \
    tests/gpu/test_megatron_smoke.py tests/gpu/test_engine_hf_gpu.py > "$OUT/mg/gpu_tests.log" 2>&1;
    echo "pytest rc=$? t=${SECONDS}s" >> "$OUT/mg/gpu_tests.log") &
PT=$!
CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29511 timeout 150 python3 -m bench.engines.megatron_bench --out /tmp/prewarm \
    --case prewarm experiment=h200/qwen3_30b_a3b_slice_muon_1gpu bench.steps=1 bench.warmup_steps=0 $S > "$OUT/mg/prewarm.log" 2>&1
echo "prewarm rc=$? t=${SECONDS}s" | tee -a "$OUT/mg/prewarm.log"
CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29521 $MB --case s7v_r1_ours_joint_gpu0 $F $L $J >> "$OUT/mg/gpu0.log" 2>&1
echo "round 1 done t=${SECONDS}s" | tee -a "$OUT/mg/gpu0.log"
wait $PT
grep -h "passed\|failed\|rc=" "$OUT/mg/gpu_tests.log" | tail -3
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
(CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29522 $MB --case s7v_r2_ours_split_gpu0 $F $L $S >> "$OUT/mg/gpu0.log" 2>&1) &
P0=$!
(CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29622 $MB --case s7v_r2_ours_joint_gpu1 $F $L $J >> "$OUT/mg/gpu1.log" 2>&1) &
P1=$!
wait $P0 $P1
echo "round 2 done t=${SECONDS}s" | tee -a "$OUT/mg/gpu0.log"
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
if [ "$SECONDS" -lt 420 ]; then
  (CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29523 $MB --case s7v_r3_adamw_gpu0 $F $L optimizer=adamw >> "$OUT/mg/gpu0.log" 2>&1) &
  P0=$!
  (CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29623 $MB --case s7v_r3_ours_split_gpu1 $F $L $S >> "$OUT/mg/gpu1.log" 2>&1) &
  P1=$!
  wait $P0 $P1
  echo "round 3 done t=${SECONDS}s" | tee -a "$OUT/mg/gpu0.log"
  tar czf "$OUT/mg/runs.tgz" -C /tmp runs
fi
kill $SMI
if [ "$SECONDS" -lt 540 ]; then
  timeout 50 python3 -m pytest -q -p no:cacheprovider -rA tests/gpu/test_dist_nccl.py > "$OUT/x2/nccl_tests.log" 2>&1
  echo "nccl pytest rc=$? t=${SECONDS}s" >> "$OUT/x2/nccl_tests.log"; grep -h "passed\|failed\|rc=" "$OUT/x2/nccl_tests.log" | tail -2
fi
grep -h "\] ok\|FAILED\|killed\|Error" "$OUT/mg/gpu0.log" "$OUT/mg/gpu1.log" | sort -u | head -20
echo "done t=${SECONDS}s"
