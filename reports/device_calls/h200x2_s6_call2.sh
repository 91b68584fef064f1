#!/usr/bin/env bash
# Session 6, call 2 (call Q) on nvidia-h200-x2. Issue 7: the NS overlapped with the backward (optimizer.ns_overlap,
# optim.megatron.overlap): each layer's NS starts in the last micro-batch's backward on a side stream.
# Call P (1eb07ec) measured the overlap with its hooks registered for every micro-batch: optimizer step 0.058-0.072 s
# (NS 0.175 s moved into the backward), but every micro-batch 3 ms slower (hook Python, 1,548 matrices x 82
# micro-batches = 0.25 s per step): ratio ~0.99 as before. Now the hooks are armed only before the last micro-batch.
# Predicted: micro-batches as fast as AdamW's (mb_rest_ms within ~0.5 ms), optimizer step ~0.06-0.07 s, the last
# micro-batch ~0.05-0.15 s longer (the NS shares the SMs with its backward): ratio 0.993-0.999.
# Two GPUs of one host: GPU1 runs the GPU tests while GPU0 prewarms (64-seq, one step, with overlap: plans the
# per-layer NS shapes); then a crossover, round 1 ours(overlap) on GPU0 while AdamW runs on GPU1, round 2 swapped;
# then, time permitting, round 1 again.
# Run from the repo root, .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200x2_s6_call1.sh`.
set -u
source reports/device_calls/device_env.sh
export TRITON_CACHE_DIR=/tmp/triton
mkdir -p "$TRITON_CACHE_DIR"
{ nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv; nproc; } > "$OUT/mg/env.txt" 2>&1
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs --case-timeout-s 170"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=4 bench.warmup_steps=1 bench.microbatch_times=true"
O="optimizer.ns_precision=fp16"
V="optimizer.ns_overlap=true"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv -lms 1000 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
(CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -rA \
    tests/gpu/test_megatron_smoke.py -k "ns_overlap" \
    > "$OUT/mg/gpu_tests.log" 2>&1
 echo "pytest rc=$? t=${SECONDS}s" >> "$OUT/mg/gpu_tests.log") &
PT=$!
CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29511 timeout 150 python3 -m bench.engines.megatron_bench --out /tmp/prewarm \
    --case prewarm experiment=h200/qwen3_30b_a3b_slice_muon_1gpu bench.steps=1 bench.warmup_steps=0 $O $V > "$OUT/mg/prewarm.log" 2>&1
echo "prewarm rc=$? t=${SECONDS}s" | tee -a "$OUT/mg/prewarm.log"
wait $PT
grep -h "passed\|failed\|rc=" "$OUT/mg/gpu_tests.log" | tail -3
(CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29521 $MB --case s6q_r1_ours_ov_gpu0 $F $L $O $V --case s6q_r2_adamw_gpu0 $F $L optimizer=adamw > "$OUT/mg/gpu0.log" 2>&1) &
P0=$!
(CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29622 $MB --case s6q_r1_adamw_gpu1 $F $L optimizer=adamw --case s6q_r2_ours_ov_gpu1 $F $L $O $V > "$OUT/mg/gpu1.log" 2>&1) &
P1=$!
wait $P0 $P1
echo "crossover done t=${SECONDS}s" | tee -a "$OUT/mg/gpu0.log"
if [ "$SECONDS" -lt 440 ]; then
  (CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29531 $MB --case s6q_r3_ours_ov_gpu0 $F $L $O $V >> "$OUT/mg/gpu0.log" 2>&1) &
  P0=$!
  (CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29632 $MB --case s6q_r3_adamw_gpu1 $F $L optimizer=adamw >> "$OUT/mg/gpu1.log" 2>&1) &
  P1=$!
  wait $P0 $P1
fi
kill $SMI
grep -h "\] ok\|FAILED\|killed\|Error" "$OUT/mg/gpu0.log" "$OUT/mg/gpu1.log" | sort -u | head -20
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
cp /tmp/nsplan/ns_plan.json "$OUT/mg/ns_plan_after.json"
echo "done t=${SECONDS}s"
