#!/usr/bin/env bash
# Session 2 (2026-11-29), device call D (diagnostic, the last ~6 min of device time) on one H200.
# Ours on the FLOP-matched Qwen3 slice with engine.empty_unused_memory_level=1 (torch.cuda.empty_cache() after the
# optimizer step, inside the timed step): is ours' +0.14-0.20 s forward-backward a caching-allocator effect of the
# optimizer step's large transient NS buffers? Compare its fwd+bwd with AdamW's of calls A-C (20.56-20.67 s).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_megatron/*.whl || exit 1
export PYTHONPATH=.:/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export MUONBENCH_CACHE=/tmp/nsplan
mkdir -p /tmp/nsplan /tmp/runs "$OUT/mg"
cp reports/ns_kernels_h200_202611/ns_plan.json /tmp/nsplan/
python3 -m bench.engines.megatron_bench --out /tmp/runs --case-timeout-s 200 --case qflops_muon_ours_empty1 \
    experiment=h200/qwen3_30b_a3b_slice_flops_muon_1gpu engine.empty_unused_memory_level=1 > "$OUT/mg/flops.log" 2>&1
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
grep -h "\] step\|\] ok\|FAILED\|killed" "$OUT/mg/flops.log"
