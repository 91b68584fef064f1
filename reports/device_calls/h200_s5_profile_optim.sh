#!/usr/bin/env bash
# Prepared in session 4, NOT RUN yet: what is in ours' optimizer step besides NS? Session 4 (call K): ours 0.267 s
# (NS 0.195 s) against AdamW's whole 0.063-0.076 s step; ideal memory traffic of ours' non-NS work is ~30 ms
# (fused pack 14 B/param + update 12 B/param + Megatron's bf16 copy 6 B/param over 3.6 G matrix params, Adam on
# 0.7 G, grad norm), measured 0.072 s. The optimizer step does not depend on the micro-batch count, so the
# 64-sequence slice (a 4 s step, a small trace) shows it: one profiled step per optimizer, --prewarm so ours runs
# warm, chrome traces kept for `reports/megatron_h200_flops_202611/profile/trace_analysis.py` (idle GPU time in the
# optimizer phase by the host op behind each gap). Run from the repo root, .whl_megatron carried, as
# `MUONBENCH_GIT_SHA=<short sha> bash reports/device_calls/h200_s5_profile_optim.sh`.
set -u
source reports/device_calls/device_env.sh
Q="experiment=h200/qwen3_30b_a3b_slice_muon_1gpu bench.steps=3 bench.warmup_steps=1"
export MUONBENCH_PROFILE_TRACE=1
python3 -m bench.engines.megatron_bench --out /tmp/runs --prewarm --profile --case-timeout-s 200 \
    --case s5p_adamw $Q optimizer=adamw --case s5p_muon_ours $Q > "$OUT/mg/profile.log" 2>&1
grep -h "\] step\|GPU window\|\] ok\|prewarm" "$OUT/mg/profile.log"
tar czf "$OUT/mg/runs.tgz" --exclude='trace_step*' -C /tmp runs
for c in s5p_adamw s5p_muon_ours; do gzip -c /tmp/runs/$c/trace_step3.json > "$OUT/mg/trace_$c.json.gz"; done
for f in "$OUT"/mg/trace_*.gz; do [ "$(stat -c %s "$f")" -lt 16000000 ] || rm "$f"; done
python3 reports/megatron_h200_flops_202611/profile/trace_analysis.py "$OUT"/mg/trace_*.json.gz > "$OUT/mg/trace_analysis.txt" 2>&1
tail -40 "$OUT/mg/trace_analysis.txt"
