#!/usr/bin/env bash
# Prepared for the next session (not run yet): why is ours' forward-backward 0.6-1.0% slower than AdamW's and the
# built-in's (reports/megatron_h200_flops_202611)? One profiled step per case on the 64-sequence Qwen3 slice
# (16 micro-batches; the FLOP-matched slice's 82 would make a very large trace): per-phase kernel time vs wall time
# (profile_step4.json in each run directory). A larger fwd_bwd gap_s for ours = the host is late (launch gaps, host
# syncs); a larger fwd_bwd kernel_s = the GPU ran the same work slower. Run from the repo root, .whl_megatron carried,
# as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/next_h200_profile.sh`.
set -u
source reports/device_calls/device_env.sh
Q="experiment=h200/qwen3_30b_a3b_slice_muon_1gpu bench.steps=4 bench.warmup_steps=1"
# SM clock, power and temperature every 200 ms through the cases (a throttled GPU runs the same kernels slower)
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 200 > "$OUT/mg/smi.csv" 2>&1 &
SMI=$!
export MUONBENCH_PROFILE_TRACE=1
python3 -m bench.engines.megatron_bench --out /tmp/runs --profile --case-timeout-s 240 \
    --case prof_adamw $Q optimizer=adamw --case prof_muon_ours $Q --case prof_muon_megatron $Q optimizer=muon_megatron \
    > "$OUT/mg/profile.log" 2>&1
kill $SMI
tar czf "$OUT/mg/runs.tgz" --exclude='trace_step*' -C /tmp runs
for t in /tmp/runs/*/*/trace_step*.json /tmp/runs/*/trace_step*.json; do
    [ -f "$t" ] || continue
    case=$(basename "$(dirname "$t")"); gzip -c "$t" > "$OUT/trace_${case}.json.gz"
    ls -la "$OUT/trace_${case}.json.gz"
    [ "$(stat -c %s "$OUT/trace_${case}.json.gz")" -lt 16000000 ] || rm "$OUT/trace_${case}.json.gz"
done
grep -h "profiled step\|kernels\|\] ok" "$OUT/mg/profile.log"
# The standalone layer step, fused vs unfused Muon (the engine measured the fused path only inside Megatron).
timeout 120 python3 -m bench.optim_step device=cuda format=md \
    impls=adamw_foreach,optim_muon,optim_muon_no_ns,optim_muon_unfused,optim_muon_unfused_no_ns,eo_muon \
    > "$OUT/optim_step.md" 2>&1
tail -12 "$OUT/optim_step.md"
