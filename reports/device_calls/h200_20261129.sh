#!/usr/bin/env bash
# The final device call of 2026-11-29 on one H200 (the 2-GPU kind was withdrawn before the call; see
# h200x2_20261129.sh for the plan with two GPUs): Megatron Qwen3 slice AdamW / Muon (ours) / Muon (built-in) first,
# then the optimizer-step micro-benchmark, then the Kimi K2 slice with what time is left. Run from the repo root
# with .whl_megatron carried. Every phase has a time limit; results land in $OUT as they finish.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_megatron/*.whl || exit 1
export PYTHONPATH=.:/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export MUONBENCH_CACHE=/tmp/nsplan
mkdir -p /tmp/nsplan /tmp/runs "$OUT/mg"
cp reports/ns_kernels_h200_202611/ns_plan.json /tmp/nsplan/
{ nvidia-smi; python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count())'; } > "$OUT/env.txt" 2>&1
Q="experiment=h200/qwen3_30b_a3b_slice_muon_1gpu bench.steps=4 bench.warmup_steps=1"
K="model=kimi_k2_slice model.num_layers=4 parallelism=single_gpu parallelism.gbs=16 parallelism.mbs=2 engine=megatron hardware=h200 bench.steps=4 bench.warmup_steps=1"
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs"
$MB --budget-s 230 --case-timeout-s 110 --case qwen_adamw $Q optimizer=adamw --case qwen_muon_ours $Q \
    --case qwen_muon_megatron $Q optimizer=muon_megatron > "$OUT/mg/qwen.log" 2>&1
echo "qwen done t=${SECONDS}s" >> "$OUT/mg/qwen.log"
tar czf "$OUT/mg/runs_qwen.tgz" -C /tmp runs
if [ "$SECONDS" -lt 420 ]; then
  timeout 60 python3 -m bench.optim_step device=cuda format=md > "$OUT/optim_step.md" 2>&1
  echo "rc=$? t=${SECONDS}s" >> "$OUT/optim_step.md"
fi
left=$(( 500 - SECONDS ))
if [ "$left" -gt 60 ]; then
  $MB --budget-s $(( left - 60 )) --case-timeout-s 75 --case kimi_adamw $K optimizer=adamw \
      --case kimi_muon_ours $K optimizer=muon --case kimi_muon_megatron $K optimizer=muon_megatron > "$OUT/mg/kimi.log" 2>&1
  echo "kimi done t=${SECONDS}s" >> "$OUT/mg/kimi.log"
  tar czf "$OUT/mg/runs_all.tgz" -C /tmp runs
fi
tail -4 "$OUT/mg/qwen.log" "$OUT/mg/kimi.log" 2>/dev/null
