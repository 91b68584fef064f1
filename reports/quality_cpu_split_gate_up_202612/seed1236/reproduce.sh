#!/usr/bin/env bash
# Reruns the whole sweep in one process, then writes this report from its state.
set -euo pipefail
OUT_DIR=${1:-runs/quality_cpu}
python -m bench.tools.quality profile=cpu seed=1236 optimizers=adamw,muon,muon_split_gate_up out="$OUT_DIR"
python -m bench.tools.quality.report src="$OUT_DIR" dest=reports/quality_cpu_split_gate_up_202612/seed1236
