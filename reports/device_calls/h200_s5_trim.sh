#!/usr/bin/env bash
# Prepared in session 4, NOT RUN yet. Session 4's reading: the ours process that compiles our Triton kernels in its
# first step runs its later forward-backwards ~0.5% slower (calls B, G-K); a process that finds the kernels compiled
# on disk does not, even when it measures the NS plan itself (call I, NS x1: plan re-measured, 2.2 s, no penalty).
# Test of one mechanism (a host heap fragmented by the in-process LLVM compile): ours with empty Triton and plan
# caches and `bench.malloc_trim=true` (glibc malloc_trim(0) after the warm-up step), between AdamW runs, then ours
# with both caches warm. Run from the repo root, .whl_megatron carried, as
# `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200_s5_trim.sh`.
set -u
source reports/device_calls/device_env.sh
export MUONBENCH_CACHE=/tmp/nsplan_s5 TRITON_CACHE_DIR=/tmp/triton_s5
mkdir -p "$MUONBENCH_CACHE" "$TRITON_CACHE_DIR"
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=4 bench.warmup_steps=1 bench.microbatch_times=true"
$MB --budget-s 425 --case-timeout-s 160 --case s5t_adamw $F optimizer=adamw $L \
    --case s5t_muon_ours_cold_trim $F $L bench.malloc_trim=true \
    --case s5t_muon_ours_warm $F $L \
    --case s5t_adamw2 $F optimizer=adamw $L > "$OUT/mg/flops.log" 2>&1
echo "flops done t=${SECONDS}s" >> "$OUT/mg/flops.log"
grep -h "\] step\|\] ok\|FAILED\|killed\|skipped" "$OUT/mg/flops.log"
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
