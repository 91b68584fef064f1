#!/usr/bin/env bash
# Reproduces reports/soap_eigh_h200_202612 on one GPU from the repository root (about 3 minutes on an H200): one
# eigenbasis refresh of SOAP-REKLS's factor census on the gpu quality model, timed as one batched eigh, over CUDA
# streams, on the host and with MAGMA, plus the optimizer's own eigh_descending (`product`). Prints each row as it is
# measured and writes $OUT/soap_eigh.json (default OUT=out).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
${PY:-python} -m experiments.soap_eigh.soap_eigh profile=gpu streams=4,8,16,32 repeats=1 out="$OUT/soap_eigh.json"
