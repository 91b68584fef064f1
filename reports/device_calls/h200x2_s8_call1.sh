#!/usr/bin/env bash
# Prepared in session 7, not yet run (the session's device time was spent).
# Issue 7 follow-up: ours-split's NS is now 0.110 s per step, all of it 768 x 2048 matrices (aspect 2.67). The kernel
# notes (reports/gpu_notes/ns_kernels.md) found Gram-NS (`optimizer.use_gram_ns=true`: iterate on the 768 x 768 Gram,
# restart before iteration 2) faster than plain NS from aspect ~2.5 on large batches. Count for 768 x 2048, 5 steps:
# plain with symmetric products ~20.4 GFLOP per matrix, Gram-NS ~16.3 (-20%). Predicted: NS 0.110 -> 0.090-0.100 s if
# the plan picks a Gram method (it keeps only candidates within 5% of plain NS), ratio +0.05-0.1%; the orthogonality
# error of Gram-NS was within +0.0012 of plain on the kernel report's shapes. CPU check in session 7 (2 matrices 768 x
# 2048, singular values log-spaced 1 .. 1e-3, quintic 5 steps, one restart): relative distance to the SVD polar factor
# plain 0.4489 / Gram 0.4489 (fp32), 0.4499 / 0.4529 (bf16): the same where 5 steps end, slightly worse in bf16.
# Design: prewarm both configurations (GPU0, GPU1), then a crossover of ours-split-gram vs ours-split (no AdamW: the
# difference between the two is the optimizer step; the AdamW ratio follows from calls T-V), and a third round
# ours-split-gram vs AdamW for the pool.
# Run from the repo root, .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200x2_s8_call1.sh`.
set -u
source reports/device_calls/device_env.sh
export TRITON_CACHE_DIR=/tmp/triton
mkdir -p "$TRITON_CACHE_DIR"
{ nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv; nproc; } > "$OUT/mg/env.txt" 2>&1
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs --case-timeout-s 170"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=4 bench.warmup_steps=1 bench.microbatch_times=true bench.moe_load_stats=true"
S="optimizer=muon_split_gate_up optimizer.ns_precision=fp16"
G="$S optimizer.use_gram_ns=true"
P="experiment=h200/qwen3_30b_a3b_slice_muon_1gpu bench.steps=1 bench.warmup_steps=0"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv -lms 1000 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
(CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29511 timeout 170 python3 -m bench.engines.megatron_bench --out /tmp/prewarm0 \
    --case prewarm_gram $P $G > "$OUT/mg/prewarm_gram.log" 2>&1; echo "prewarm gram rc=$? t=${SECONDS}s") &
W0=$!
(CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29611 timeout 170 python3 -m bench.engines.megatron_bench --out /tmp/prewarm1 \
    --case prewarm_split $P $S > "$OUT/mg/prewarm_split.log" 2>&1; echo "prewarm split rc=$? t=${SECONDS}s") &
W1=$!
wait $W0 $W1
cp /tmp/nsplan/ns_plan.json "$OUT/mg/ns_plan.json"
round() {  # round NAME0 "OVERRIDES0" NAME1 "OVERRIDES1" N
  (CUDA_VISIBLE_DEVICES=0 MASTER_PORT=$((29520 + $5)) $MB --case "$1" $F $L $2 >> "$OUT/mg/gpu0.log" 2>&1) &
  local p0=$!
  (CUDA_VISIBLE_DEVICES=1 MASTER_PORT=$((29620 + $5)) $MB --case "$3" $F $L $4 >> "$OUT/mg/gpu1.log" 2>&1) &
  local p1=$!
  wait $p0 $p1
  echo "round $5 done t=${SECONDS}s" | tee -a "$OUT/mg/gpu0.log"
  tar czf "$OUT/mg/runs.tgz" -C /tmp runs
}
round s8a_r1_ours_gram_gpu0 "$G" s8a_r1_ours_split_gpu1 "$S" 1
round s8a_r2_ours_split_gpu0 "$S" s8a_r2_ours_gram_gpu1 "$G" 2
if [ "$SECONDS" -lt 440 ]; then
  round s8a_r3_adamw_gpu0 "optimizer=adamw" s8a_r3_ours_gram_gpu1 "$G" 3
fi
kill $SMI
grep -h "\] ok\|FAILED\|killed\|Error" "$OUT/mg/gpu0.log" "$OUT/mg/gpu1.log" | sort -u | head -20
echo "done t=${SECONDS}s"
