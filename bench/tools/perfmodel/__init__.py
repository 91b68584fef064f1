"""Cluster-scale performance model: per-GPU step time and TF/GPU of a config at any scale (pure Python, no torch).

`predict(cfg, profile)` (profiles `published` and `ours`), `choose_tp_mode(rows, cols, tp, hardware)` for
`tp_mode=auto`, calibration against NVIDIA blog Table 1 in `calibrate`, the report in `report`. CLI:
`python -m bench.tools.project` (bench/tools/project.py). Constants and their sources: `constants`.
"""

from bench.tools.perfmodel.model import Prediction, predict, tp_mode_table
from bench.tools.perfmodel.nscost import choose_tp_mode, tp_mode_times

__all__ = ["Prediction", "choose_tp_mode", "predict", "tp_mode_table", "tp_mode_times"]
