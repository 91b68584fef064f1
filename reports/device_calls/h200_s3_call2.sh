#!/usr/bin/env bash
# Session 3, call 2: (1) host-dispatch probe: is anything ours leaves in the process slowing the host? plus Megatron's
# multi-tensor fallbacks vs optim.megatron.multi_tensor; (2) the 64-sequence Qwen3 slice, AdamW and ours, one
# profiled step each, now with the foreach multi-tensor replacements (all builders); (3) GPU tests of the Megatron
# engine. Run as `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200_s3_call2.sh`, .whl_megatron carried.
set -u
source reports/device_calls/device_env.sh
timeout 150 python3 reports/device_calls/host_probe.py > "$OUT/host_probe.log" 2>&1; echo "probe rc $?"
cat "$OUT/host_probe.log" | grep "^{"
Q="experiment=h200/qwen3_30b_a3b_slice_muon_1gpu bench.steps=4 bench.warmup_steps=1"
export MUONBENCH_PROFILE_TRACE=1
python3 -m bench.engines.megatron_bench --out /tmp/runs --profile --case-timeout-s 200 \
    --case prof2_adamw $Q optimizer=adamw --case prof2_muon_ours $Q > "$OUT/mg/profile.log" 2>&1
grep -h "\] step\|GPU window\|\] ok" "$OUT/mg/profile.log"
tar czf "$OUT/mg/runs.tgz" --exclude='trace_step*' -C /tmp runs
gzip -c /tmp/runs/prof2_muon_ours/trace_step4.json > "$OUT/trace_prof2_muon_ours.json.gz"
gzip -c /tmp/runs/prof2_adamw/trace_step4.json > "$OUT/trace_prof2_adamw.json.gz"
for f in "$OUT"/trace_*.gz; do [ "$(stat -c %s "$f")" -lt 16000000 ] || rm "$f"; done
timeout 200 python3 -m pytest -q -rA tests/gpu/test_megatron_smoke.py > "$OUT/pytest_gpu.log" 2>&1
tail -15 "$OUT/pytest_gpu.log"
