#!/usr/bin/env bash
# The one device call of 2026-11-29 on nvidia-h200-x2 (2 x H200): Megatron slices (issue 7), NCCL correctness and
# layer-wise optimizer scaling 1 -> 2 GPUs (issue 11), the optimizer-step micro-benchmark on CUDA. Every phase has a
# time limit; results land in $OUT as they finish. Run from the repo root with .whl_megatron carried.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_megatron/*.whl || exit 1
export PYTHONPATH=.:/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export MUONBENCH_CACHE=/tmp/nsplan
mkdir -p /tmp/nsplan /tmp/runs "$OUT/mg" "$OUT/x2"
cp reports/ns_kernels_h200_202611/ns_plan.json /tmp/nsplan/
{ nvidia-smi; python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count())'; git rev-parse HEAD 2>/dev/null; } > "$OUT/x2/env.txt" 2>&1
Q="experiment=h200/qwen3_30b_a3b_slice_muon_1gpu bench.steps=4 bench.warmup_steps=1"
K="model=kimi_k2_slice model.num_layers=4 parallelism=single_gpu parallelism.gbs=16 parallelism.mbs=2 engine=megatron hardware=h200 bench.steps=4 bench.warmup_steps=1"
MB="python3 -m bench.engines.megatron_bench --out /tmp/runs"
# Phase A, two GPUs side by side: GPU0 AdamW vs Muon (ours) on the Qwen slice; GPU1 Megatron's built-in Muon on the
# same slice, then the Kimi K2 slice.
(CUDA_VISIBLE_DEVICES=0 MASTER_PORT=29511 $MB --budget-s 140 --case-timeout-s 115 \
   --case qwen_adamw $Q optimizer=adamw --case qwen_muon_ours $Q > "$OUT/mg/gpu0.log" 2>&1) &
(CUDA_VISIBLE_DEVICES=1 MASTER_PORT=29622 $MB --budget-s 190 --case-timeout-s 100 \
   --case qwen_muon_megatron $Q optimizer=muon_megatron --case kimi_adamw $K optimizer=adamw \
   --case kimi_muon_ours $K optimizer=muon --case kimi_muon_megatron $K optimizer=muon_megatron > "$OUT/mg/gpu1.log" 2>&1) &
wait
echo "phase A done t=${SECONDS}s" >> "$OUT/mg/gpu0.log"
tar czf "$OUT/mg/runs.tgz" -C /tmp runs
# Phase B, both GPUs: NCCL correctness, then the layer-wise optimizer step at 1 and 2 GPUs.
if [ "$SECONDS" -lt 400 ]; then
  timeout 100 python3 -m pytest -q -p no:cacheprovider -rA tests/gpu/test_dist_nccl.py > "$OUT/x2/nccl_tests.log" 2>&1
  echo "pytest rc=$? t=${SECONDS}s" >> "$OUT/x2/nccl_tests.log"
  for n in 1 2; do
    timeout 60 python3 -m torch.distributed.run --standalone --nproc_per_node=$n -m bench.optim_scaling out="$OUT/x2" >> "$OUT/x2/scaling.log" 2>&1
    echo "n=$n rc=$? t=${SECONDS}s" >> "$OUT/x2/scaling.log"
  done
fi
# Phase C: one Qwen3-30B-A3B layer optimizer step, optim.Muon after the multi-tensor rewrite vs AdamW vs EO.
if [ "$SECONDS" -lt 480 ]; then
  timeout 60 python3 -m bench.optim_step device=cuda format=md > "$OUT/x2/optim_step.md" 2>&1
  echo "rc=$? t=${SECONDS}s" >> "$OUT/x2/optim_step.md"
fi
tail -3 "$OUT/mg/gpu0.log" "$OUT/mg/gpu1.log" "$OUT/x2/nccl_tests.log" "$OUT/x2/scaling.log"
