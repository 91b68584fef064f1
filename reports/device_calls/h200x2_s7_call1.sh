#!/usr/bin/env bash
# Session 7, call 1 (call T) on nvidia-h200-x2.
# Issue 7, two levers on ours' 1.05% deficit (0.8% NS, 0.3% forward-backward):
# 1. optimizer.split_gate_up=true: each expert's fused fc1 (1536 x 2048) orthogonalized as its gate and up halves
#    (768 x 2048 each; HF layout, Moonlight; MCore orthogonalizes them jointly), now on the fused path as a view of
#    the packed stack. Predicted: NS 0.175 -> ~0.12 s (fc1 139 ms -> ~72 ms: twice fc2's 36 ms), ratio ~0.992.
#    Crossover: round 1 ours-split on GPU0 / AdamW on GPU1, round 2 swapped.
# 2. If time is left, round 3: AdamW on GPU0 / ours-split with the router on AdamW on GPU1. With
#    bench.moe_load_stats on every run (max / mean tokens per expert per step). Predicted if Muon's router updates
#    unbalance the experts: ours' load ratio above AdamW's from step 1, the router-on-AdamW run's at AdamW's.
# GPU tests first (GPU1, while GPU0 prewarms the split shapes): the fused split step vs unfused on CUDA, the energy /
# micro-batch / expert-load test.
# Run from the repo root, .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200x2_s7_call1.sh`.
set -u
source reports/device_calls/device_env.sh
export TRITON_CACHE_DIR=/tmp/triton
mkdir -p "$TRITON_CACHE_DIR"
{ nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv; nproc; } > "$OUT/mg/env.txt" 2>&1
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs --case-timeout-s 170"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=4 bench.warmup_steps=1 bench.microbatch_times=true bench.moe_load_stats=true"
O="optimizer.ns_precision=fp16 optimizer.split_gate_up=true"
R="optimizer.router_to_matrix_optimizer=false"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv -lms 1000 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
(CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -rA tests/gpu/test_megatron_smoke.py \
    tests/gpu/test_kernels_gpu.py -k "energy or fused_step_matches" > "$OUT/mg/gpu_tests.log" 2>&1;
    echo "pytest rc=$? t=${SECONDS}s" >> "$OUT/mg/gpu_tests.log") &
PT=$!
CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29511 timeout 150 python3 -m bench.engines.megatron_bench --out /tmp/prewarm \
    --case prewarm experiment=h200/qwen3_30b_a3b_slice_muon_1gpu bench.steps=1 bench.warmup_steps=0 $O > "$OUT/mg/prewarm.log" 2>&1
echo "prewarm rc=$? t=${SECONDS}s" | tee -a "$OUT/mg/prewarm.log"
wait $PT
grep -h "passed\|failed\|rc=" "$OUT/mg/gpu_tests.log" | tail -3
cp /tmp/nsplan/ns_plan.json "$OUT/mg/ns_plan.json"
(CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29521 $MB --case s7t_r1_ours_split_gpu0 $F $L $O --case s7t_r2_adamw_gpu0 $F $L optimizer=adamw > "$OUT/mg/gpu0.log" 2>&1) &
P0=$!
(CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29622 $MB --case s7t_r1_adamw_gpu1 $F $L optimizer=adamw --case s7t_r2_ours_split_gpu1 $F $L $O > "$OUT/mg/gpu1.log" 2>&1) &
P1=$!
wait $P0 $P1
echo "crossover done t=${SECONDS}s" | tee -a "$OUT/mg/gpu0.log"
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
if [ "$SECONDS" -lt 400 ]; then
  (CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29531 $MB --case s7t_r3_adamw_gpu0 $F $L optimizer=adamw >> "$OUT/mg/gpu0.log" 2>&1) &
  P0=$!
  (CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29632 $MB --case s7t_r3_ours_split_router_adamw_gpu1 $F $L $O $R >> "$OUT/mg/gpu1.log" 2>&1) &
  P1=$!
  wait $P0 $P1
  echo "round 3 done t=${SECONDS}s" | tee -a "$OUT/mg/gpu0.log"
  tar czf "$OUT/mg/runs.tgz" -C /tmp runs
fi
kill $SMI
cp /tmp/nsplan/ns_plan.json "$OUT/mg/ns_plan.json"
grep -h "\] ok\|FAILED\|killed\|Error" "$OUT/mg/gpu0.log" "$OUT/mg/gpu1.log" | sort -u | head -20
echo "done t=${SECONDS}s"
