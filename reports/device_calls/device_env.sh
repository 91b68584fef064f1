# Sourced by device-call scripts (from the repo root, .whl_megatron carried): installs the carried wheels to
# /tmp/site, sets the NCCL / Python environment and seeds the NS plan cache with the kernel report's plan.
# The device copy has no usable git metadata: start the call as `MUONBENCH_GIT_SHA=$(git rev-parse --short HEAD)
# bash reports/device_calls/<script>.sh` (the SHA typed into the run command) so the run records name the commit.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_megatron/*.whl || exit 1
export PYTHONPATH=.:/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export MUONBENCH_CACHE=/tmp/nsplan
mkdir -p /tmp/nsplan /tmp/runs "$OUT/mg"
# the kernel report's plan and the Qwen3-slice shapes measured in session 4 (call K, bf16) and session 5 (call N, fp16
# iterate, every symmetric config); the two files share no key
python3 -c 'import json, sys; print(json.dumps({k: v for f in sys.argv[1:] for k, v in json.load(open(f)).items()}))' \
    reports/ns_kernels_h200_202611/ns_plan.json reports/megatron_h200_flops_202611/ns_plan_qwen3_slice_h200.json \
    > /tmp/nsplan/ns_plan.json
