#!/usr/bin/env bash
# Session 5, call 3 on one H200 (call N; the x2 crossover in h200x2_s5_call3.sh could not run: status no longer
# listed nvidia-h200-x2). Call M (b73f463) put ours (fp16 iterate) at 0.988 / 0.991 of the AdamW runs before /
# after it (20.882 s vs 20.632 / 20.689 s): one ours run between two AdamW runs cannot separate drift from the
# optimizer at that size. Here ours and AdamW alternate, two runs each (B A B A), ours prewarmed (64-seq slice,
# one step in a throwaway process: Triton cache and NS plan on disk), 3 steady steps per run. New since call M
# (so measured by the prewarm's plan, never timed before): symmetric-kernel configs with the epilogue through tensor
# descriptors (tma128o, tma128w4o) and with Triton's warp specialization (tma128wso); their GPU tests run first.
# Run from the repo root, .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200_s5_call3.sh`.
set -u
source reports/device_calls/device_env.sh
export TRITON_CACHE_DIR=/tmp/triton
mkdir -p "$TRITON_CACHE_DIR"
timeout 60 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_kernels_gpu.py -k "sym_mm_bf16 and (tma128o or tma128wso)" \
    > "$OUT/mg/pytest_kernels.log" 2>&1
RC=$?
echo "pytest kernels rc=$RC t=${SECONDS}s" | tee -a "$OUT/mg/pytest_kernels.log"; grep -h "passed\|failed" "$OUT/mg/pytest_kernels.log" | tail -2
# a failing (or crashing) new config must not reach the timed runs: the plan skips all three then
[ "$RC" -eq 0 ] || export MUONBENCH_NS_SKIP=tma128o,tma128w4o,tma128wso
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=4 bench.warmup_steps=1 bench.microbatch_times=true"
O="optimizer.ns_precision=fp16"
timeout 120 python3 -m bench.engines.megatron_bench --out /tmp/prewarm \
    --case prewarm experiment=h200/qwen3_30b_a3b_slice_muon_1gpu bench.steps=1 bench.warmup_steps=0 $O > "$OUT/mg/prewarm.log" 2>&1
echo "prewarm rc=$? t=${SECONDS}s" | tee -a "$OUT/mg/prewarm.log"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 500 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
timeout $(( 590 - SECONDS )) python3 -m bench.engines.megatron_bench --out /tmp/runs --budget-s $(( 460 - SECONDS )) \
    --case-timeout-s 150 \
    --case s5n_muon_ours_fp16 $F $L $O --case s5n_adamw $F $L optimizer=adamw \
    --case s5n_muon_ours_fp16_2 $F $L $O --case s5n_adamw2 $F $L optimizer=adamw > "$OUT/mg/flops.log" 2>&1
echo "flops rc=$? t=${SECONDS}s" >> "$OUT/mg/flops.log"
kill $SMI
grep -h "\] ok\|FAILED\|killed\|skipped\|Error" "$OUT/mg/flops.log" | sort -u
cp /tmp/nsplan/ns_plan.json "$OUT/mg/ns_plan.json"
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
echo "done t=${SECONDS}s"
