#!/usr/bin/env bash
# Session 3, call 4 on one H200: the FLOP-matched pair of call 3 in the reverse order (ours first, then AdamW). The
# GPU runs power-capped (~680 W, SM clock 1.5-2.0 GHz; call 3's nvidia-smi log) and AdamW's forward-backward rose
# step by step in call 3 (20.35 -> 20.64 s) while it ran first: an order effect. AB (call 3) + BA (this call) cancel a
# linear drift. Then the multi-tensor GPU test (fixed: it needs a process group). Run from the repo root,
# .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200_s3_call4.sh`.
set -u
source reports/device_calls/device_env.sh
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 1000 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=5 bench.warmup_steps=1"
$MB --budget-s 420 --case-timeout-s 215 --case s3b_qflops_muon_ours $F $L \
    --case s3b_qflops_adamw $F optimizer=adamw $L > "$OUT/mg/flops.log" 2>&1
echo "flops done t=${SECONDS}s" >> "$OUT/mg/flops.log"
grep -h "\] step\|\] ok\|FAILED\|killed\|skipped" "$OUT/mg/flops.log"
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
kill $SMI
timeout $(( 470 - SECONDS )) python3 -m pytest -q -rA -p no:cacheprovider \
    "tests/gpu/test_megatron_smoke.py::test_multi_tensor_foreach_matches_megatrons_fallbacks_on_cuda" > "$OUT/pytest_gpu.log" 2>&1
echo "rc=$? t=${SECONDS}s" >> "$OUT/pytest_gpu.log"; grep -h "PASSED\|FAILED\|rc=\|^E " "$OUT/pytest_gpu.log" | head
