#!/usr/bin/env bash
# Reproduces reports/ns_kernels_h200_202612 on one H200, offline, from the repository root (at most 12.5 minutes: every
# step after the two test gates runs under a deadline; the tables are printed from whatever the steps wrote).
# Needs: python3.12 with torch 2.11.0+cu130 and Triton; wheels of the package's dependencies in .whl/ (hydra-core,
# omegaconf, emerging-optimizers, megatron-core) and of the `quack` extra in .whl_quack/ (the pins of pyproject.toml,
# `pip download --no-deps`). Writes under $OUT (default ./out):
#   pytest_new.log, pytest_quack.log  the new Triton configs and QuACK's products against fp32 (run first: a config
#                                     that fails there is kept out of the plan, QuACK's explicit general- and
#                                     symmetric-product configs too; QuACK dropped if its own products fail)
#   ns_kernels_h200_202612/           bench.tools.ns_kernels: results.json/.csv, README.md, ns.png, ns_plan.json
#   optim_step.json                   bench.tools.optim_step (20 steps after 5 warm-up steps): Qwen3-30B-A3B layer step,
#   optim_step_buckets.json           joint and split gate/up fc1, parameters as separate tensors, and in the
#                                     layer-wise optimizer's buffers
#   optim_step_capped_*.json          the same after 20 warm-up steps (the power-capped state alone), both layouts
#   update_fold.json                  experiments.update_fold: last NS product + update, unfused and folded, at the cap
#   optim_step.png                    the layer-step times, every layout and warm-up, against the 30 ms target
#   pytest_gpu.log                    all kernel GPU tests, in the time left
#   env.txt                           versions, GPU, the commit ($MUONBENCH_GIT_SHA)
#   gates.env                         what the test gates kept out (read by a later run of the same $OUT)
# and prints the plan-against-peers table (ours / fastest peer) and both layer-step tables.
# STEPS (default "gates ns steps fold tests") runs a subset, e.g. STEPS="gates ns" then STEPS="steps fold tests"
# into the same $OUT: the layer steps use the plan the NS benchmark measured and the gates' exclusions.
set -u
OUT=${OUT:-out}
STEPS=" ${STEPS:-gates ns steps fold tests} "
for s in $STEPS; do
    case $s in gates | ns | steps | fold | tests) ;; *)
        echo "STEPS: unknown step '$s' (allowed: gates ns steps fold tests)" >&2
        exit 2 ;;
    esac
done
has() { [[ $STEPS == *" $1 "* ]]; }
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/qsite .whl_quack/*.whl || exit 1
Q=/tmp/qsite:/tmp/qsite/nvidia_cutlass_dsl/dsl_packages
export PYTHONPATH=.:/tmp/site:$Q TRITON_CACHE_DIR=/tmp/triton PYTHONUNBUFFERED=1
{
    echo "steps:$STEPS$(date -u +%FT%TZ)"
    echo "commit ${MUONBENCH_GIT_SHA:-unknown} pythonpath=$PYTHONPATH"
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
    python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)'
    python3 -m pip list --path /tmp/qsite --path /tmp/site 2>/dev/null | grep -iE "quack|cutlass|tvm|emerging"
} >> "$OUT/env.txt" 2>&1
T="python3 -m pytest -q -p no:cacheprovider tests/gpu/test_kernels_gpu.py"
left() { echo $(($1 - SECONDS > 10 ? $1 - SECONDS : 10)); }  # seconds until mark $1 (never 0: no limit)
if has gates; then
    timeout 100 $T -k "sym_mm_bf16 and (g8 or g4 or ptma)" > "$OUT/pytest_new.log" 2>&1 ||
        export MUONBENCH_NS_SKIP=tma128g8,tma256g4,ptma128,ptma256,ptma128o
    Q_LOG=$OUT/pytest_quack.log
    if ! timeout 150 $T -k quack -rf > "$Q_LOG" 2>&1; then
        if ! grep -q '^FAILED' "$Q_LOG" || grep '^FAILED' "$Q_LOG" | grep -v general_config | grep -qv 'sym128[a-z]'; then
            export PYTHONPATH=.:/tmp/site  # QuACK's products failed, or the run crashed or timed out: no QuACK
        else  # only explicit configs failed: those are kept out of the plan
            bad=$(grep -o 'general_config_bf16\[[a-z0-9_]*' "$Q_LOG" | cut -d[ -f2 | sort -u | paste -sd,)
            sym=$(grep '^FAILED' "$Q_LOG" | grep -o 'sym128[a-z]*' | sort -u | paste -sd,)
            bad=${bad:+$bad,}$sym; bad=${bad%,}
            export MUONBENCH_NS_SKIP=${MUONBENCH_NS_SKIP:+$MUONBENCH_NS_SKIP,}$bad
        fi
    fi
    tail -n 2 "$OUT"/pytest_new.log "$OUT"/pytest_quack.log
    echo "skip=${MUONBENCH_NS_SKIP:-} pythonpath=$PYTHONPATH" >> "$OUT/env.txt"
    { echo "export PYTHONPATH=$PYTHONPATH"; echo "export MUONBENCH_NS_SKIP=${MUONBENCH_NS_SKIP:-}"; } > "$OUT/gates.env"
elif [ -f "$OUT/gates.env" ]; then
    . "$OUT/gates.env"
fi
R=$OUT/ns_kernels_h200_202612
if has ns; then
    timeout "$(left 440)" python3 -m bench.tools.ns_kernels out="$R" eo_syrk=none > "$OUT/bench.log" 2>&1
    echo "bench rc=$? t=${SECONDS}s"
fi
STEP="python3 -m bench.tools.optim_step device=cuda format=json repeats=20 warmup=5"
IMPLS=adamw_foreach,optim_muon,optim_muon_split,optim_muon_fp16,optim_muon_vouched,optim_muon_no_ns
if has steps; then  # separate tensors, then the layer-wise optimizer's flat buffers, then both capped
    MUONBENCH_CACHE=$R timeout "$(left 490)" $STEP impls=$IMPLS,eo_muon > "$OUT/optim_step.json" 2>> "$OUT/bench.log"
    echo "optim_step rc=$? t=${SECONDS}s"
    MUONBENCH_CACHE=$R timeout "$(left 540)" $STEP impls=$IMPLS layout=buckets > "$OUT/optim_step_buckets.json" 2>> "$OUT/bench.log"
    echo "optim_step layout=buckets rc=$? t=${SECONDS}s"
    for layout in separate buckets; do
        MUONBENCH_CACHE=$R timeout "$(left 580)" $STEP warmup=20 layout=$layout \
            impls=optim_muon,optim_muon_vouched,optim_muon_split > "$OUT/optim_step_capped_$layout.json" 2>> "$OUT/bench.log"
        echo "optim_step capped layout=$layout rc=$? t=${SECONDS}s"
    done
fi
if has fold; then
    timeout "$(left 620)" python3 -m experiments.update_fold.fold out="$OUT/update_fold.json" >> "$OUT/bench.log" 2>&1
    echo "update_fold rc=$? t=${SECONDS}s"
fi
if has tests; then
    timeout "$(left 735)" $T > "$OUT/pytest_gpu.log" 2>&1
    echo "pytest rc=$? t=${SECONDS}s"; tail -n 3 "$OUT/pytest_gpu.log"
fi
# results.json is written after every shape, so the plan table prints even if the benchmark was cut short
python3 - "$R/results.json" "$OUT"/optim_step*.json <<'PY' || true
import json, sys
from bench.tools.ns_kernels import render_markdown, render_plan
from bench.tools.optim_step import to_markdown
try:
    res = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    res = {}
    print(f"({sys.argv[1]}: {e})")
print("\n".join(render_plan(res)))
md = render_markdown(res) if "steps" in res else ""
print(md[md.find("## One-layer optimizer step"):] if "## One-layer" in md else "(no layer steps)")
steps = []
for path in sys.argv[2:]:
    try:
        steps.append(json.load(open(path)))
        print(to_markdown(steps[-1]))
    except (OSError, ValueError) as e:
        print(f"({path}: {e})")
if steps:  # the joint-fc1 target's line; warm-up 5 before the capped state, buckets before separate
    from pathlib import Path
    from bench.results.plots import save, step_times_figure
    steps.sort(key=lambda r: (r.get("warmup", 1), r.get("layout") != "buckets"))
    save(step_times_figure(steps, target_ms=30), Path(sys.argv[2]).parent / "optim_step.png")
PY
