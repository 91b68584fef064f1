#!/usr/bin/env bash
# One optimizer step over a Qwen3-30B-A3B layer scaled by 1/16 on CPU (host-side work only), one intra-op thread.
# About 2 minutes. Prints JSON per implementation.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PY:-.venv/bin/python}
$PY -m bench.tools.optim_step threads=1 format=json repeats=10 impls=adamw_foreach,optim_muon,optim_muon_no_ns
