#!/usr/bin/env bash
# Session 3, call 3 on one H200: (1) the fused-step kernel tests (new transposing momentum-pack / update kernels);
# (2) FLOP-matched Qwen3 slice, AdamW then ours, now with the foreach multi-tensor replacements (all builders),
# the NS input of tall matrices packed in its wide orientation (no transpose copies) and the gradient screen
# skipped when Megatron's global grad norm is finite; (3) the Megatron GPU tests. Run from the repo root,
# .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200_s3_call3.sh`.
set -u
source reports/device_calls/device_env.sh
{ nvidia-smi; python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count())'; } > "$OUT/env.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 1000 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
timeout 90 python3 -m pytest -q -rA -p no:cacheprovider "tests/gpu/test_kernels_gpu.py::test_fused_step_kernels" \
    "tests/gpu/test_kernels_gpu.py::test_muon_fused_step_matches_unfused_on_cuda" > "$OUT/pytest_kernels.log" 2>&1
echo "rc=$? t=${SECONDS}s" >> "$OUT/pytest_kernels.log"; tail -4 "$OUT/pytest_kernels.log"
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=5 bench.warmup_steps=1"
$MB --budget-s $(( 450 - SECONDS )) --case-timeout-s 190 --case s3_qflops_adamw $F optimizer=adamw $L \
    --case s3_qflops_muon_ours $F $L > "$OUT/mg/flops.log" 2>&1
echo "flops done t=${SECONDS}s" >> "$OUT/mg/flops.log"
grep -h "\] step\|\] ok\|FAILED\|killed\|skipped" "$OUT/mg/flops.log"
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
timeout $(( 575 - SECONDS )) python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megatron_smoke.py > "$OUT/pytest_gpu.log" 2>&1
echo "rc=$? t=${SECONDS}s" >> "$OUT/pytest_gpu.log"; grep -h "PASSED\|FAILED\|rc=" "$OUT/pytest_gpu.log"
kill $SMI
