#!/usr/bin/env bash
# Reruns the whole sweep (resumable: rerun it to go on, budget_s=S per piece), then writes this report from its state.
set -euo pipefail
OUT_DIR=${1:-runs/quality_gpu}
python -m bench.tools.quality profile=gpu out="$OUT_DIR" "${@:2}"
python -m bench.tools.quality.report src="$OUT_DIR" dest=reports/quality_h200_202612
