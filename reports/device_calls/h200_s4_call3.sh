#!/usr/bin/env bash
# Session 4, call 3 on one H200. Calls I and J: ours' forward-backward penalty (+0.10-0.15 s over AdamW, here and in
# calls B, G, H) appears only in the FIRST ours process of a call, the one that measures the NS plan in its first
# step (12 s of candidate timings on the batched expert stacks); later ours processes that load the plan from disk
# ran within 0.00-0.03 s of AdamW; per-micro-batch times show the penalty spread evenly over the step, not an
# after-effect of the optimizer step. Now, with the planner handing its temporaries back (`empty_cache` after a
# measurement), in an empty plan cache: AdamW, ours planning in-process (cold), ours loading that plan (warm),
# AdamW again (brackets both). Energy off (it adds a sync before the optimizer step), micro-batch events on.
# Run from the repo root, .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200_s4_call3.sh`.
set -u
source reports/device_calls/device_env.sh
export MUONBENCH_CACHE=/tmp/nsplan_cold
mkdir -p "$MUONBENCH_CACHE"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 200 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=4 bench.warmup_steps=1 bench.microbatch_times=true"
$MB --budget-s 425 --case-timeout-s 160 --case s4c_adamw $F optimizer=adamw $L \
    --case s4c_muon_ours_cold $F $L \
    --case s4c_muon_ours_warm $F $L \
    --case s4c_adamw2 $F optimizer=adamw $L > "$OUT/mg/flops.log" 2>&1
echo "flops done t=${SECONDS}s" >> "$OUT/mg/flops.log"
grep -h "\] step\|\] ok\|FAILED\|killed\|skipped" "$OUT/mg/flops.log"
kill $SMI
cp "$MUONBENCH_CACHE/ns_plan.json" "$OUT/mg/ns_plan_cold.json"
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
if [ "$SECONDS" -lt 530 ]; then
  timeout $(( 585 - SECONDS )) python3 -m pytest -q -rA -p no:cacheprovider \
      "tests/gpu/test_megatron_smoke.py::test_energy_microbatches_and_idle_before_step_recorded" > "$OUT/mg/pytest_gpu.log" 2>&1
  echo "rc=$? t=${SECONDS}s" >> "$OUT/mg/pytest_gpu.log"; grep -h "PASSED\|FAILED\|rc=\|^E " "$OUT/mg/pytest_gpu.log" | head
fi
