#!/usr/bin/env bash
# Session 6, call 3 (call R) on nvidia-h200-x2.
# Issue 7: calls P / Q showed the NS overlap hides nothing on one H200 (the last micro-batch grows by the NS time;
# the GPUs draw ~680 of 700 W during the step). Here one more crossover of ours WITHOUT overlap (fp16 iterate) against
# AdamW, round 1 ours on GPU0 / AdamW on GPU1, round 2 swapped, to pool with calls M, N (one GPU) for the ratio.
# Issue 11: the layer-wise optimizer step of one Qwen3 layer at 1 GPU (the point call O lost) and 2 GPUs, same call.
# Run from the repo root, .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200x2_s6_call3.sh`.
set -u
source reports/device_calls/device_env.sh
export TRITON_CACHE_DIR=/tmp/triton
mkdir -p "$TRITON_CACHE_DIR" "$OUT/x2"
{ nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv; nproc; } > "$OUT/mg/env.txt" 2>&1
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs --case-timeout-s 170"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=4 bench.warmup_steps=1 bench.microbatch_times=true"
O="optimizer.ns_precision=fp16"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv -lms 1000 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
(CUDA_VISIBLE_DEVICES=1 timeout 160 python3 -m torch.distributed.run --standalone --nproc_per_node=1 -m bench.optim_scaling \
    strategies=lpt_cost out="$OUT/x2" > "$OUT/x2/scaling.log" 2>&1; echo "n=1 rc=$? t=${SECONDS}s" >> "$OUT/x2/scaling.log") &
PS=$!
CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29511 timeout 150 python3 -m bench.engines.megatron_bench --out /tmp/prewarm \
    --case prewarm experiment=h200/qwen3_30b_a3b_slice_muon_1gpu bench.steps=1 bench.warmup_steps=0 $O > "$OUT/mg/prewarm.log" 2>&1
echo "prewarm rc=$? t=${SECONDS}s" | tee -a "$OUT/mg/prewarm.log"
wait $PS
tail -2 "$OUT/x2/scaling.log"
(CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29521 $MB --case s6r_r1_ours_gpu0 $F $L $O --case s6r_r2_adamw_gpu0 $F $L optimizer=adamw > "$OUT/mg/gpu0.log" 2>&1) &
P0=$!
(CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29622 $MB --case s6r_r1_adamw_gpu1 $F $L optimizer=adamw --case s6r_r2_ours_gpu1 $F $L $O > "$OUT/mg/gpu1.log" 2>&1) &
P1=$!
wait $P0 $P1
echo "crossover done t=${SECONDS}s" | tee -a "$OUT/mg/gpu0.log"
grep -h "\] ok\|FAILED\|killed\|Error" "$OUT/mg/gpu0.log" "$OUT/mg/gpu1.log" | sort -u | head -20
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
if [ "$SECONDS" -lt 500 ]; then
  timeout $(( 580 - SECONDS )) python3 -m torch.distributed.run --standalone --nproc_per_node=2 -m bench.optim_scaling \
      strategies=lpt_cost out="$OUT/x2" >> "$OUT/x2/scaling.log" 2>&1
  echo "n=2 rc=$? t=${SECONDS}s" >> "$OUT/x2/scaling.log"
fi
kill $SMI
tail -3 "$OUT/x2/scaling.log"; echo "done t=${SECONDS}s"
