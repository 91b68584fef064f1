#!/usr/bin/env bash
# Session 2 (2026-11-29), device call B on one H200. Run from the repo root with .whl_megatron carried.
# 1. The GPU tests that failed in call A (host RNG seeding fixed; fused-step test index fixed).
# 2. FLOP-matched Qwen3 slice (328 x 4096 tokens/step): Megatron's built-in Muon, then AdamW and ours again with
#    more steady steps (call A: the fwd+bwd medians differed by 0.12 s with a 0.2 s within-run spread).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_megatron/*.whl || exit 1
export PYTHONPATH=.:/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export MUONBENCH_CACHE=/tmp/nsplan
mkdir -p /tmp/nsplan /tmp/runs "$OUT/mg"
cp reports/ns_kernels_h200_202611/ns_plan.json /tmp/nsplan/
{ nvidia-smi; python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count())'; } > "$OUT/env.txt" 2>&1
timeout 120 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_megatron_smoke.py \
    "tests/gpu/test_kernels_gpu.py::test_muon_fused_step_matches_unfused_on_cuda" > "$OUT/pytest_gpu.log" 2>&1
echo "rc=$? t=${SECONDS}s" >> "$OUT/pytest_gpu.log"
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
L="bench.steps=5 bench.warmup_steps=1"
$MB --budget-s $(( 470 - SECONDS )) --case-timeout-s 185 --case qflops_muon_megatron $F optimizer=muon_megatron \
    --case qflops_adamw $F optimizer=adamw $L --case qflops_muon_ours $F $L > "$OUT/mg/flops.log" 2>&1
echo "flops done t=${SECONDS}s" >> "$OUT/mg/flops.log"
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
tail -3 "$OUT/pytest_gpu.log"; grep -h "\] ok\|FAILED\|killed\|skipped" "$OUT/mg/flops.log"
