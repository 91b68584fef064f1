#!/usr/bin/env bash
# Session 5, call 1 on one H200 (call L). What is left of ours' FLOP-matched gap with warm caches (0.988, call K) is
# the optimizer step: NS 0.195 s, of which the fc1 expert stack (768 x 1536 x 2048) 151.9 ms with the Triton
# symmetric kernel at ~75% of cuBLAS' efficiency, and 17.6 ms of X copies (baddbmm). New, never run on a GPU:
# the TMA symmetric kernel (configs tma128, tma128s5, tma256: 128 x 256 tiles) and the fp16 iterate with a I folded
# into P (`optimizer.ns_precision=fp16`). This call: (1) bench.ns_tiles on the slice's NS problems (products per
# config vs cuBLAS, whole NS bf16 and fp16, the plan it measures); (2) the kernel GPU tests (the new configs and the
# fp16 tests); (3) the 64-sequence slice, ours bf16 and ours fp16, 3 steps, one profiled step each with its trace;
# (4) Triton's cache and the plan cache packed (warm.tgz) for the next call's timed runs.
# Run from the repo root, .whl_megatron carried, as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200_s5_call1.sh`.
set -u
source reports/device_calls/device_env.sh
export TRITON_CACHE_DIR=/tmp/triton
mkdir -p "$TRITON_CACHE_DIR"
LOG="$OUT/mg/call.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$LOG" 2>&1
timeout 270 python3 -m bench.ns_tiles plan=reports/megatron_h200_flops_202611/ns_plan_qwen3_slice_h200.json \
    out=/tmp/ns_tiles >> "$LOG" 2>&1
echo "ns_tiles rc=$? t=${SECONDS}s" >> "$LOG"
cp /tmp/ns_tiles/README.md "$OUT/mg/ns_tiles.md"; cp /tmp/ns_tiles/results.json "$OUT/mg/ns_tiles.json"
# the plan measured by ns_tiles (bf16 and fp16 keys, every candidate incl. the TMA configs) over the seeded one
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d.update(json.load(open(sys.argv[2]))); json.dump(d, open(sys.argv[1], "w"), indent=1, sort_keys=True)' \
    /tmp/nsplan/ns_plan.json /tmp/ns_tiles/ns_plan.json
timeout 150 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_kernels_gpu.py > "$OUT/mg/pytest_kernels.log" 2>&1
echo "pytest kernels rc=$? t=${SECONDS}s" >> "$LOG"; grep -h "passed\|failed" "$OUT/mg/pytest_kernels.log" | tail -2
Q="experiment=h200/qwen3_30b_a3b_slice_muon_1gpu bench.steps=3 bench.warmup_steps=1"
export MUONBENCH_PROFILE_TRACE=1
timeout $(( 560 - SECONDS )) python3 -m bench.engines.megatron_bench --out /tmp/runs --profile --case-timeout-s 150 \
    --case s5l_muon_ours $Q --case s5l_muon_ours_fp16 $Q optimizer.ns_precision=fp16 >> "$LOG" 2>&1
echo "megatron rc=$? t=${SECONDS}s" >> "$LOG"
grep -h "\] step\|GPU window\|\] ok\|FAILED\|Error" "$LOG" | tail -20
tar czf "$OUT/mg/runs.tgz" --exclude='trace_step*' -C /tmp runs
gzip -c /tmp/runs/s5l_muon_ours/trace_step3.json > "$OUT/mg/trace_ours.json.gz" 2>/dev/null
[ "$(stat -c %s "$OUT/mg/trace_ours.json.gz" 2>/dev/null || echo 0)" -lt 16000000 ] || rm -f "$OUT/mg/trace_ours.json.gz"
python3 reports/megatron_h200_flops_202611/profile/trace_analysis.py /tmp/runs/*/trace_step3.json > "$OUT/mg/trace_analysis.txt" 2>&1
tail -30 "$OUT/mg/trace_analysis.txt"
tar czf "$OUT/mg/warm.tgz" -C /tmp triton nsplan
ls -la "$OUT/mg"; echo "done t=${SECONDS}s"
