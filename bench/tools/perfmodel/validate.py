"""Validation of the optimizer-step model on one H200 against measured whole-layer optimizer steps.

The kernel benchmark's data (`calibration.NS_KERNELS`) times `optimizer.step()` for one Qwen3-30B-A3B layer
(q, k, v, o and 128 experts as separate matrices, no router) and one Kimi K2 MoE layer at EP64 (6 experts, MLA,
shared expert, router): EO Muon (the published loop), our batched step and fused AdamW. The model predicts the same parameter
sets with the same code paths as the cluster prediction (`optimizer.rank_loads_ms` on one rank).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import flops
from bench.tools.perfmodel import constants as C
from bench.tools.perfmodel import nscost
from bench.tools.perfmodel import optimizer as opt
from bench.tools.perfmodel.calibrate import hbm_fraction
from bench.tools.perfmodel.calibration import NS_KERNELS
from muonbench.schema import HardwareConfig, ModelConfig, ParallelismConfig

LAYERS: dict[str, tuple[str, int, bool]] = {
    "qwen3_30b_a3b_layer": ("qwen3_30b_a3b", 1, False),
    "kimi_k2_moe_layer_ep64": ("kimi_k2", 64, True),
}
"""results.json step name -> (model config, EP size, router included)."""
IMPLS = {"eo_muon": ("muon", "published"), "ours": ("muon", "ours"), "adamw_fused": ("adamw", "published")}
TRANSCRIBED: tuple[tuple[str, str, float, str], ...] = (
    ("qwen3_30b_a3b_layer", "eo_muon", 196.4, "docs/references.md#h200-baseline (first H200 run)"),
    ("qwen3_30b_a3b_layer", "adamw_fused", 5.01, "docs/references.md#h200-baseline (first H200 run)"),
)
"""Layer steps measured in other runs: (layer, impl, ms, source)."""


def layer_items(model: ModelConfig, ep: int, *, router: bool) -> list[opt.Item]:
    """The matrices of one MoE layer held by one EP rank (QKV split, as MCore)."""
    items: list[opt.Item] = []
    for m in flops.enumerate_ns_matrices(model, split_qkv=True, router_to_matrix=router):
        if m.layer_type == "dense":
            continue
        n = m.per_layer // ep if m.expert else m.per_layer
        items += [
            opt.Item(rows=m.rows, cols=m.cols, expert=m.expert, muon=True, tp_dim=m.tp_partition_dim)
        ] * n
    return items


def predict_layer_ms(
    model: ModelConfig, ep: int, hw: HardwareConfig, optimizer: str, profile: str, *, router: bool
) -> float:
    """Predicted optimizer.step() milliseconds of one layer on one GPU."""
    items = layer_items(model, ep, router=router)
    par = ParallelismConfig(name="one", world_size=1, ep=1)
    algo = opt.Algo(
        optimizer=optimizer,
        profile=profile,
        grad_sync="reduce_scatter",
        assignment="lpt_cost",
        overlap_param_gather=True,
        batched=profile == "ours",
        convention="gram" if profile == "ours" else "plain",
        num_ns_steps=5,
        tp_mode="duplicated",
    )
    rate_hbm = hw.hbm_tbps * 1e12 * C.efficiency(hw.name).hbm.value
    table = nscost.measured_table(profile)
    return opt.rank_loads_ms(items, [0] * len(items), 1, par, hw, algo, rate_hbm, table, [0.0])[0]


def layer_step_comparison(path: Path = NS_KERNELS) -> list[dict[str, Any]]:
    """Measured vs predicted standalone optimizer steps on H200: the kernel benchmark's layer steps (when its
    results exist) and the measured layer steps, at the standalone fused-AdamW bandwidth (HBM_EFFICIENCY); the
    in-engine steps are in `h200` (Megatron runs)."""
    from muonbench import load

    data = json.loads(path.read_text()) if path.exists() else {}
    steps, source = data.get("steps", {}), data.get("provenance", {}).get("source", path.name)
    hw = nscost.load_hardware("h200")
    out: list[dict[str, Any]] = []
    measured_rows = [
        (name, impl, float(v["ms"]), source)
        for name in LAYERS
        for impl, v in steps.get(name, {}).get("impls", {}).items()
        if impl in IMPLS and "ms" in v
    ]
    for name, impl, ms, source in [*measured_rows, *TRANSCRIBED]:
        model_name, ep, router = LAYERS[name]
        model = load([f"model={model_name}"], validate_=False).model
        optimizer, profile = IMPLS[impl]
        with hbm_fraction(
            "h200", C.HBM_EFFICIENCY.value
        ):  # standalone benchmarks: standalone kernel bandwidth
            pred = predict_layer_ms(model, ep, hw, optimizer, profile, router=router)
        out.append(
            {
                "layer": name,
                "impl": impl,
                "profile": profile,
                "measured_ms": ms,
                "predicted_ms": pred,
                "rel_error": pred / ms - 1.0,
                "source": source,
            }
        )
    return out
