#!/usr/bin/env bash
# Prepared in session 4, NOT RUN yet: the FLOP-matched Qwen3 slice with `--prewarm` (one untimed one-step child per
# workload of our optimizer first, so the timed processes find Triton's kernel cache and the NS plan cache on disk),
# AdamW, ours, AdamW (ABA: brackets drift), 3 steady steps each; then the energy / micro-batch GPU
# test. Expectation from session 4 (call K): ours ~0.988 x AdamW, forward-backward within ~0.03 s of AdamW's.
# Run from the repo root, .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200_s5_next.sh`.
set -u
source reports/device_calls/device_env.sh
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 200 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs --prewarm"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=4 bench.warmup_steps=1 bench.microbatch_times=true"
$MB --budget-s 400 --case-timeout-s 160 --case s5_adamw $F optimizer=adamw $L --case s5_muon_ours $F $L \
    --case s5_adamw2 $F optimizer=adamw $L > "$OUT/mg/flops.log" 2>&1
echo "flops done t=${SECONDS}s" >> "$OUT/mg/flops.log"
grep -h "\] step\|\] ok\|prewarm\|FAILED\|killed\|skipped" "$OUT/mg/flops.log"
kill $SMI
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
timeout $(( 585 - SECONDS )) python3 -m pytest -q -rA -p no:cacheprovider \
    "tests/gpu/test_megatron_smoke.py::test_energy_microbatches_and_idle_before_step_recorded" > "$OUT/mg/pytest_gpu.log" 2>&1
echo "rc=$? t=${SECONDS}s" >> "$OUT/mg/pytest_gpu.log"; grep -h "PASSED\|FAILED\|rc=\|^E " "$OUT/mg/pytest_gpu.log" | head
