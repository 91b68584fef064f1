#!/usr/bin/env bash
# Reruns the whole sweep in one process, then writes this report from its state.
set -euo pipefail
OUT_DIR=${1:-runs/quality_gpu}
python -m bench.tools.quality profile=gpu out="$OUT_DIR"
python -m bench.tools.quality.report src="$OUT_DIR" dest=reports/quality_h200_202612
