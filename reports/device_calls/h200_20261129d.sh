#!/usr/bin/env bash
# Session 2 (2026-11-29), device call C on one H200. Run from the repo root with .whl_megatron carried.
# 1. The ours-vs-built-in first-update test in fp32 and bf16 NS (router tolerance question of call B).
# 2. FLOP-matched Qwen3 slice, AdamW vs ours with engine.manual_gc=true (now the engine default): call B had ours'
#    forward-backward 0.14 s slower than AdamW's and 0.20 s slower than the built-in's with identical model work.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_megatron/*.whl || exit 1
export PYTHONPATH=.:/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export MUONBENCH_CACHE=/tmp/nsplan
mkdir -p /tmp/nsplan /tmp/runs "$OUT/mg"
cp reports/ns_kernels_h200_202611/ns_plan.json /tmp/nsplan/
timeout 100 python3 -m pytest -q -rA -p no:cacheprovider \
    "tests/gpu/test_megatron_smoke.py::test_first_update_ours_matches_megatron_builtin" > "$OUT/pytest_gpu.log" 2>&1
echo "rc=$? t=${SECONDS}s" >> "$OUT/pytest_gpu.log"
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs"
F="experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu"
$MB --budget-s $(( 330 - SECONDS )) --case-timeout-s 190 --case qflops_adamw_gc $F optimizer=adamw \
    --case qflops_muon_ours_gc $F > "$OUT/mg/flops.log" 2>&1
echo "flops done t=${SECONDS}s" >> "$OUT/mg/flops.log"
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
tail -3 "$OUT/pytest_gpu.log"; grep -h "\] step\|\] ok\|FAILED\|killed\|skipped" "$OUT/mg/flops.log"
