#!/usr/bin/env bash
# Reproduces reports/soap_step_h200_202612 on one GPU from the repository root (about 50 s on an H200): per-step times
# of SOAP-REKLS on the gpu quality model, refresh steps apart, and a profile of two plain steps by part.
# Writes $OUT/soap_step.json (default OUT=out).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
${PY:-python} -m experiments.soap_step.soap_step profile=gpu device=cuda steps=10 profile_steps=3 out="$OUT/soap_step.json"
