#!/usr/bin/env bash
# Calibrate this GPU, then predict and run a model no committed run uses and check that the measured step times fall
# inside the predicted intervals (bench.tools.perfmodel.check; at most +-10% wide, resting on the profile just
# written). Case: Mixtral-8x7B as a 2-layer one-GPU slice (tests/unit/fixtures/hf_configs/mixtral_8x7b), the
# Megatron-core engine, AdamW against Muon by `muonbench compare`, each prediction recorded beside its runs.
# HW is the hardware group of this GPU (default h100); BUDGET each compare's minutes (default 20); OUT the report
# folder (default reports/calibration_check_<HW>_<yyyymm>): it gets profile.json, cases/, summary.json and run.json.
# The protocol and what passes: docs/perfmodel.md#calibration-check.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
cd "$HERE/../.."
PY=${PY:-python}
HW=${HW:-h100}
BUDGET=${BUDGET:-20}
OUT=${OUT:-reports/calibration_check_${HW}_$(date +%Y%m)}
MODEL="model=hf:tests/unit/fixtures/hf_configs/mixtral_8x7b model.num_layers=2"
mkdir -p "$OUT/cases"
# shellcheck disable=SC2086  # MODEL is words
$PY -m bench.tools.calibrate experiment=h200/hf_slice_megatron_1gpu $MODEL hardware="$HW" out="$OUT/profile.json"
mkdir -p "${MUONBENCH_HARDWARE_PROFILES:-$HOME/.cache/muonbench/hardware_profiles}"
cp "$OUT/profile.json" "${MUONBENCH_HARDWARE_PROFILES:-$HOME/.cache/muonbench/hardware_profiles}/"
# shellcheck disable=SC2086
$PY -m bench.tools.project experiment=h200/hf_slice_megatron_1gpu $MODEL hardware="$HW" optimizer=muon profile=ours
# shellcheck disable=SC2086
$PY -m bench.tools.compare experiment=h200/hf_slice_megatron_1gpu $MODEL hardware="$HW" \
    --budget-min "$BUDGET" --precision 0.01 --max-runs 6 --out "$OUT/cases/mixtral_8x7b_2l_megatron" || true
$PY -m bench.tools.perfmodel.check "$OUT"
