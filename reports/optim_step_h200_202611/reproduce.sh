#!/usr/bin/env bash
# One Qwen3-30B-A3B layer optimizer step on a GPU: torch AdamW, optim.Muon, optim.MOP, emerging-optimizers Muon.
# Needs one GPU. About 1 minute. Prints a markdown table (median and IQR of 10 steps).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PY:-.venv/bin/python}
$PY -m bench.tools.optim_step device=cuda format=md
