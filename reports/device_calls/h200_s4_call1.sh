#!/usr/bin/env bash
# Session 4, call 1 on one H200: why ours' forward-backward is +0.12 s (0.6%) over AdamW's on the FLOP-matched Qwen3
# slice in both run orders (session 3). Hypothesis: the GPU runs at its power cap and ours' Newton-Schulz burst
# (the most power-dense kernels of the step) leaves the clock held down into the next forward-backward. Four cases,
# GPU energy / power / clock per phase from NVML (`bench.energy=true`), nvidia-smi at 100 ms with clock-event
# reasons: AdamW; ours; ours with 1 NS iteration instead of 5 (same kernels and process, a fifth of the NS energy);
# ours with the GPU idle 1 s before each step (outside the timed step). Then the new energy GPU test. Run from the
# repo root, .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200_s4_call1.sh`.
set -u
source reports/device_calls/device_env.sh
{ nvidia-smi -q -d POWER,CLOCK,PERFORMANCE; python3 -c 'import torch, triton, pynvml; print(torch.__version__, triton.__version__, torch.cuda.device_count())'; } > "$OUT/mg/env.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 100 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=3 bench.warmup_steps=1 bench.energy=true"
$MB --budget-s 420 --case-timeout-s 170 --case s4_adamw $F optimizer=adamw $L \
    --case s4_muon_ours $F $L \
    --case s4_muon_ours_ns1 $F $L optimizer.num_ns_steps=1 \
    --case s4_muon_ours_idle $F $L bench.idle_before_step_s=1.0 > "$OUT/mg/flops.log" 2>&1
echo "flops done t=${SECONDS}s" >> "$OUT/mg/flops.log"
grep -h "\] step\|\] ok\|FAILED\|killed\|skipped" "$OUT/mg/flops.log"
kill $SMI
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
timeout $(( 580 - SECONDS )) python3 -m pytest -q -rA -p no:cacheprovider \
    "tests/gpu/test_megatron_smoke.py::test_energy_and_idle_before_step_recorded" > "$OUT/mg/pytest_gpu.log" 2>&1
echo "rc=$? t=${SECONDS}s" >> "$OUT/mg/pytest_gpu.log"; grep -h "PASSED\|FAILED\|rc=\|^E " "$OUT/mg/pytest_gpu.log" | head
