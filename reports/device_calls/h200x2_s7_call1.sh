#!/usr/bin/env bash
# Prepared in session 6, not yet run. Issue 7: call S put ~0.3% of the gap (ours' forward-backward 55-80 ms longer than
# AdamW's on the same GPU) on training dynamics (gone at lr=0). Hypothesis: Muon's router updates (the router is
# Muon's, as in Megatron) make the expert load less balanced, so the grouped GEMMs run longer for the same FLOPs.
# Test: bench.moe_load_stats (max / mean tokens per expert, per step) on every run; crossover ours vs AdamW, then ours
# with the router on AdamW (optimizer.router_to_matrix_optimizer=false) vs AdamW. Predicted if the hypothesis
# holds: ours' load ratio above AdamW's from step 1 on, and the router-on-AdamW run's forward-backward within ~20 ms
# of AdamW's. Also runs the energy / micro-batch / load GPU test (tests/gpu/test_megatron_smoke.py -k energy).
# Run from the repo root, .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200x2_s7_call1.sh`.
set -u
source reports/device_calls/device_env.sh
export TRITON_CACHE_DIR=/tmp/triton
mkdir -p "$TRITON_CACHE_DIR"
{ nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv; nproc; } > "$OUT/mg/env.txt" 2>&1
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs --case-timeout-s 170"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=4 bench.warmup_steps=1 bench.microbatch_times=true bench.moe_load_stats=true"
O="optimizer.ns_precision=fp16"
R="optimizer.router_to_matrix_optimizer=false"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv -lms 1000 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
(CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -rA tests/gpu/test_megatron_smoke.py -k energy \
    > "$OUT/mg/gpu_tests.log" 2>&1; echo "pytest rc=$? t=${SECONDS}s" >> "$OUT/mg/gpu_tests.log") &
PT=$!
CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29511 timeout 150 python3 -m bench.engines.megatron_bench --out /tmp/prewarm \
    --case prewarm experiment=h200/qwen3_30b_a3b_slice_muon_1gpu bench.steps=1 bench.warmup_steps=0 $O > "$OUT/mg/prewarm.log" 2>&1
wait $PT
grep -h "passed\|failed\|rc=" "$OUT/mg/gpu_tests.log" | tail -2
(CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29521 $MB --case s7a_r1_ours_gpu0 $F $L $O --case s7a_r2_adamw_gpu0 $F $L optimizer=adamw > "$OUT/mg/gpu0.log" 2>&1) &
P0=$!
(CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29622 $MB --case s7a_r1_adamw_gpu1 $F $L optimizer=adamw --case s7a_r2_ours_router_adamw_gpu1 $F $L $O $R > "$OUT/mg/gpu1.log" 2>&1) &
P1=$!
wait $P0 $P1
kill $SMI
grep -h "\] ok\|FAILED\|killed\|Error" "$OUT/mg/gpu0.log" "$OUT/mg/gpu1.log" | sort -u | head
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
echo "done t=${SECONDS}s"
