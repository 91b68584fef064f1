#!/usr/bin/env bash
# Session 2 (2026-11-29), device call A on one H200. Run from the repo root with .whl_megatron carried.
# 1. FLOP-matched Qwen3 slice (328 x 4096 tokens/step): AdamW vs Muon (ours, fused step path).
# 2. Every GPU test (the two Megatron comparisons now feed identical gradients; fused Muon step vs unfused).
# 3. The 64-sequence Qwen3 slice again: AdamW vs ours (fused), same call.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_megatron/*.whl || exit 1
export PYTHONPATH=.:/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export MUONBENCH_CACHE=/tmp/nsplan
mkdir -p /tmp/nsplan /tmp/runs "$OUT/mg"
cp reports/ns_kernels_h200_202611/ns_plan.json /tmp/nsplan/
{ nvidia-smi; git rev-parse HEAD 2>/dev/null; python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count())'; } > "$OUT/env.txt" 2>&1
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
$MB --budget-s 260 --case-timeout-s 190 --case qflops_adamw $F optimizer=adamw --case qflops_muon_ours $F \
    > "$OUT/mg/flops.log" 2>&1
echo "flops done t=${SECONDS}s" >> "$OUT/mg/flops.log"
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
timeout 170 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu > "$OUT/pytest_gpu.log" 2>&1
echo "rc=$? t=${SECONDS}s" >> "$OUT/pytest_gpu.log"
left=$(( 560 - SECONDS ))
if [ "$left" -gt 100 ]; then
  Q="experiment=h200/qwen3_30b_a3b_slice_muon_1gpu bench.steps=4 bench.warmup_steps=1"
  $MB --budget-s $(( left - 70 )) --case-timeout-s 90 --case qwen_muon_ours $Q --case qwen_adamw $Q optimizer=adamw \
      > "$OUT/mg/qwen.log" 2>&1
  echo "qwen done t=${SECONDS}s" >> "$OUT/mg/qwen.log"
  tar czf "$OUT/mg/runs.tgz" -C /tmp runs
fi
tail -3 "$OUT/mg/flops.log" "$OUT/pytest_gpu.log" "$OUT/mg/qwen.log" 2>/dev/null
grep -h "step_s_median\|optim_s\|model_tflops" "$OUT/mg/"*.log 2>/dev/null | tail -10
