#!/usr/bin/env bash
# Session 5, call 2 on one H200 (call M). Call L (0dbd70a) measured ours' optimizer step in place (64-seq slice,
# profiled): NS 192 ms = cuBLAS P X 78.6 + Triton symmetric 83.6 + baddbmm's X copies 17.7 + the NS-entry scale
# 9.6 (torch's broadcast multiply, < half the bandwidth) + norms 2; ~7 ms of Python before the first kernel of
# Muon's step with the GPU idle. Since then: a Triton scale-and-cast kernel for the NS entry, a I added in the
# symmetric kernel's epilogue (fp16 iterate: no copy, no separate diagonal kernel), two more TMA tile configs,
# the fused step's buckets cached between steps. Prediction: fp16 ours NS ~165-175 ms, optimizer step ~0.22-0.23
# s, FLOP-matched ratio 0.989-0.991. This call: the new kernel GPU tests; then the FLOP-matched slice with the
# product's `--prewarm` (one untimed step of ours fp16 in a throwaway process: Triton compile and NS plan on disk),
# AdamW, ours (fp16 iterate), AdamW again.
# Run from the repo root, .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200_s5_call2.sh`.
set -u
source reports/device_calls/device_env.sh
export TRITON_CACHE_DIR=/tmp/triton
mkdir -p "$TRITON_CACHE_DIR"
timeout 120 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_kernels_gpu.py \
    -k "sym_mm_bf16 or scale_cast or fp16" > "$OUT/mg/pytest_kernels.log" 2>&1
echo "pytest kernels rc=$? t=${SECONDS}s" | tee -a "$OUT/mg/pytest_kernels.log"; grep -h "passed\|failed" "$OUT/mg/pytest_kernels.log" | tail -2
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 200 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs --prewarm"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=4 bench.warmup_steps=1 bench.microbatch_times=true"
timeout $(( 585 - SECONDS )) $MB --budget-s $(( 450 - SECONDS )) --case-timeout-s 170 \
    --case s5m_adamw $F optimizer=adamw $L \
    --case s5m_muon_ours_fp16 $F $L optimizer.ns_precision=fp16 \
    --case s5m_adamw2 $F optimizer=adamw $L > "$OUT/mg/flops.log" 2>&1
echo "flops rc=$? t=${SECONDS}s" >> "$OUT/mg/flops.log"
kill $SMI
grep -h "\] step\|\] ok\|prewarm\|FAILED\|killed\|skipped\|Error" "$OUT/mg/flops.log" | tail -40
cp /tmp/nsplan/ns_plan.json "$OUT/mg/ns_plan.json"
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
echo "done t=${SECONDS}s"
