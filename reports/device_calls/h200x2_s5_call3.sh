#!/usr/bin/env bash
# Session 5, call 3 on nvidia-h200-x2 (call N). Issue 7: call M (b73f463, one H200) put ours (fp16 iterate) at
# 0.988 / 0.991 of the AdamW runs before / after it (20.882 s vs 20.632 / 20.689 s): the ABA order cannot separate
# drift from the optimizer at that size. Here a crossover on two GPUs of one host: round 1 ours on GPU0 while AdamW
# runs on GPU1, round 2 swapped; each ratio pairs runs at the same time, and the geometric mean of the two rounds
# cancels the GPUs' difference. ours is prewarmed (64-seq slice, one step: Triton cache and NS plan on disk).
# Issue 11 (ended blocked: no multi-GPU machine had been lent): NCCL correctness of the TP NS modes and the
# layer-wise optimizer (tests/gpu/test_dist_nccl.py) and the layer-wise optimizer step at 1 and 2 GPUs.
# Run from the repo root, .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200x2_s5_call3.sh`.
set -u
source reports/device_calls/device_env.sh
export TRITON_CACHE_DIR=/tmp/triton
mkdir -p "$TRITON_CACHE_DIR" "$OUT/x2"
{ nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv; nproc; } > "$OUT/mg/env.txt" 2>&1
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs --case-timeout-s 160"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=4 bench.warmup_steps=1 bench.microbatch_times=true"
O="optimizer.ns_precision=fp16"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv -lms 500 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
# prewarm on GPU0 (records dropped), then the crossover
CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29511 timeout 120 python3 -m bench.engines.megatron_bench --out /tmp/prewarm \
    --case prewarm experiment=h200/qwen3_30b_a3b_slice_muon_1gpu bench.steps=1 bench.warmup_steps=0 $O > "$OUT/mg/prewarm.log" 2>&1
echo "prewarm rc=$? t=${SECONDS}s" | tee -a "$OUT/mg/prewarm.log"
(CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29521 $MB --case s5n_r1_ours_gpu0 $F $L $O --case s5n_r2_adamw_gpu0 $F $L optimizer=adamw > "$OUT/mg/gpu0.log" 2>&1) &
P0=$!
(CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29622 $MB --case s5n_r1_adamw_gpu1 $F $L optimizer=adamw --case s5n_r2_ours_gpu1 $F $L $O > "$OUT/mg/gpu1.log" 2>&1) &
P1=$!
wait $P0 $P1
echo "crossover done t=${SECONDS}s" | tee -a "$OUT/mg/gpu0.log"
kill $SMI
grep -h "\] ok\|FAILED\|killed\|Error" "$OUT/mg/gpu0.log" "$OUT/mg/gpu1.log" | sort -u
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
if [ "$SECONDS" -lt 470 ]; then
  timeout 100 python3 -m pytest -q -p no:cacheprovider -rA tests/gpu/test_dist_nccl.py > "$OUT/x2/nccl_tests.log" 2>&1
  echo "pytest rc=$? t=${SECONDS}s" >> "$OUT/x2/nccl_tests.log"; grep -h "passed\|failed" "$OUT/x2/nccl_tests.log" | tail -2
fi
for n in 1 2; do
  [ "$SECONDS" -lt 540 ] || break
  timeout $(( 585 - SECONDS )) python3 -m torch.distributed.run --standalone --nproc_per_node=$n -m bench.optim_scaling \
      out="$OUT/x2" >> "$OUT/x2/scaling.log" 2>&1
  echo "n=$n rc=$? t=${SECONDS}s" >> "$OUT/x2/scaling.log"
done
tail -4 "$OUT/x2/scaling.log"; echo "done t=${SECONDS}s"
