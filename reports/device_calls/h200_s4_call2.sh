#!/usr/bin/env bash
# Session 4, call 2 on one H200. Call 1 (2c64d4b): ours' forward-backward +0.15 s over AdamW's, gone with the GPU
# idle 1 s before each step (host asleep) and gone with 1 NS iteration instead of 5; nvidia-smi's 100 ms clock
# samples showed no lower mean clock over ours' forward-backward. Now: where in the forward-backward the time goes
# (CUDA events at every micro-batch: the first 4 after the optimizer step vs the other 78, with the SM clock read at
# each) and which of GPU and host must rest: 0.5 s of a low-power spin kernel (host waiting on it) vs 0.5 s host
# sleep. Then the energy / micro-batch GPU tests. Run from the repo root, .whl_megatron carried, as
# `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200_s4_call2.sh`.
set -u
source reports/device_calls/device_env.sh
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 100 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=3 bench.warmup_steps=1 bench.energy=true bench.microbatch_times=true"
$MB --budget-s 400 --case-timeout-s 170 --case s4b_adamw $F optimizer=adamw $L \
    --case s4b_muon_ours $F $L \
    --case s4b_muon_ours_spin $F $L bench.idle_before_step_s=0.5 bench.idle_before_step_mode=gpu_spin \
    --case s4b_muon_ours_sleep $F $L bench.idle_before_step_s=0.5 > "$OUT/mg/flops.log" 2>&1
echo "flops done t=${SECONDS}s" >> "$OUT/mg/flops.log"
grep -h "\] step\|\] ok\|FAILED\|killed\|skipped" "$OUT/mg/flops.log"
kill $SMI
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
timeout $(( 575 - SECONDS )) python3 -m pytest -q -rA -p no:cacheprovider \
    "tests/gpu/test_megatron_smoke.py::test_energy_microbatches_and_idle_before_step_recorded" > "$OUT/mg/pytest_gpu.log" 2>&1
echo "rc=$? t=${SECONDS}s" >> "$OUT/mg/pytest_gpu.log"; grep -h "PASSED\|FAILED\|rc=\|^E " "$OUT/mg/pytest_gpu.log" | head
