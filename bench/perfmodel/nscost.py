"""Newton-Schulz time per matrix on a hardware row, including the tensor-parallel modes, and `choose_tp_mode`.

GPU time comes from a per-shape efficiency curve measured on our H200 and scaled by the hardware's bf16 GEMM
rate (NS runs bf16 GEMMs under MCore's fp32_matmul_prec "medium"): `optim.distributed.assignment.CostModel`, whose
analytic curve m / (m + 600) of the GEMM ceiling fits the H200 NS measurements (anchors.md f). When the kernel
benchmark has written `reports/ns_kernels_h200_202611/results.json`, its per-shape milliseconds replace the curve
(`measured_table`), scaled by the ratio of GEMM rates. Host time of one call is measured (constants).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import flops
from bench.perfmodel import constants as C
from bench.perfmodel import links
from bench.schema import HardwareConfig
from optim.distributed.assignment import CostModel, canonical

KERNEL_RESULTS = Path(__file__).resolve().parents[2] / "reports" / "ns_kernels_h200_202611" / "results.json"
TP_MODES = ("duplicated", "distributed", "distributed_gram", "blockwise")
HALF_EFF_DIM = CostModel().half_eff_dim  # short side at half the ceiling, fitted to anchors.md f (assignment.py)


def ns_rate(hw: HardwareConfig) -> float:
    """Achievable bf16 GEMM FLOP/s of NS on this hardware at large shapes."""
    return hw.peak_bf16_tflops * 1e12 * C.efficiency(hw.name).gemm_bf16.value


def host_call_ms(hw: HardwareConfig, num_steps: int = 5) -> float:
    """Host milliseconds of one NS call (2-D or batched 3-D) when launch-bound: measured at 5 steps, scaled by
    the launch count 3 k + fixed."""
    fixed = C.NS_CALL_FIXED_LAUNCHES.value
    per_launch = C.NS_CALL_HOST_MS.value / (3 * 5 + fixed)
    return per_launch * (3 * num_steps + fixed) * C.efficiency(hw.name).host_scale.value


def measured_table(path: Path = KERNEL_RESULTS) -> dict[tuple[int, int], float]:
    """Per-shape H200 milliseconds per matrix of our best NS kernel, if the kernel benchmark has run.

    Accepts a list of rows (or {"rows": [...]}) with `rows`, `cols` and `per_matrix_ms` (or `ms` with an optional
    `batch`); returns {} when the file is absent.
    """
    if not path.exists():
        return {}
    data: Any = json.loads(path.read_text())
    rows = data.get("rows", []) if isinstance(data, dict) else data
    out: dict[tuple[int, int], float] = {}
    for row in rows:
        if not isinstance(row, dict) or "rows" not in row or "cols" not in row:
            continue
        ms = row.get("per_matrix_ms")
        if ms is None and "ms" in row:
            ms = float(row["ms"]) / max(1, int(row.get("batch", 1)))
        if ms is not None:
            key = canonical((int(row["rows"]), int(row["cols"])))
            out[key] = min(float(ms), out.get(key, float("inf")))
    return out


def gpu_ms(rows: float, cols: float, hw: HardwareConfig, *, num_steps: int = 5, convention: str = "plain",
           table: dict[tuple[int, int], float] | None = None) -> float:
    """GPU milliseconds of NS on one rows x cols matrix (short side m, Gram m x m)."""
    m, n = min(rows, cols), max(rows, cols)
    key = (int(m), int(n))
    if table and key in table and convention == "plain" and num_steps == 5:
        h200 = C.H200_GEMM_CEILING_TFLOPS.value * 1e12
        return table[key] * h200 / ns_rate(hw)
    flop = flops.ns_flops(max(1, int(m)), max(1, int(n)), num_steps, convention)
    return flop / (ns_rate(hw) * m / (m + HALF_EFF_DIM)) * 1e3


@dataclass(frozen=True, kw_only=True, slots=True)
class TPCost:
    """Milliseconds one TP rank spends on its shard of a matrix: GPU compute and communication."""

    compute_ms: float
    comm_ms: float

    @property
    def total_ms(self) -> float:
        return self.compute_ms + self.comm_ms


def tp_cost(rows: int, cols: int, tp: int, hw: HardwareConfig, mode: str, *, partition_dim: int = 0,
            num_steps: int = 5, convention: str = "plain", triangular: bool = False,
            table: dict[tuple[int, int], float] | None = None) -> TPCost:
    """NS cost of one TP-sharded matrix under `mode` (optim.distributed.tp_orthogonalize.TPMode semantics).

    duplicated: all-gather of the fp32 shards, full NS on every rank. distributed: the sharded dim is contracted;
    k all-reduces of the unsharded-side Gram (bf16; half the bytes when `triangular`) plus one for the norm, A^2
    redundant on every rank; if the short side is sharded, NS runs on the long side. distributed_gram: the same with
    Gram-NS, 1 + restarts all-reduces. blockwise: each shard alone.
    """
    if mode not in TP_MODES:
        raise ValueError(f"tp_mode={mode!r}: must be one of {list(TP_MODES)}")
    if tp <= 1 or partition_dim < 0:
        return TPCost(compute_ms=gpu_ms(rows, cols, hw, num_steps=num_steps, convention=convention, table=table),
                      comm_ms=0.0)
    link = links.group_link(hw, tp)
    split, other = (rows, cols) if partition_dim == 0 else (cols, rows)
    if mode == "blockwise":
        return TPCost(compute_ms=gpu_ms(split / tp, other, hw, num_steps=num_steps, convention=convention,
                                        table=table), comm_ms=0.0)
    if mode == "duplicated":
        comm = links.all_gather(rows * cols * 4.0, tp, link) * 1e3
        return TPCost(compute_ms=gpu_ms(rows, cols, hw, num_steps=num_steps, convention=convention, table=table),
                      comm_ms=comm)
    conv = "gram" if mode == "distributed_gram" else convention
    flop = flops._ns_flops_mn(other, split / tp, num_steps, conv, (2,))
    m_eff = min(other, split / tp)
    compute = flop / (ns_rate(hw) * m_eff / (m_eff + HALF_EFF_DIM)) * 1e3
    gram_bytes = other * other * 2.0 * (0.5 if triangular else 1.0)
    if mode == "distributed_gram":  # R_0 once and one re-formed Gram at the restart; norm from trace(R_0)
        comm = 2 * links.all_reduce(gram_bytes, tp, link)
    else:  # one Gram all-reduce per step plus the scalar norm
        comm = num_steps * links.all_reduce(gram_bytes, tp, link) + links.all_reduce(4.0, tp, link)
    comm *= 1e3
    return TPCost(compute_ms=compute, comm_ms=comm)


def tp_mode_times(rows: int, cols: int, tp: int, hardware: HardwareConfig, *, partition_dim: int = 0,
                  num_steps: int = 5) -> dict[str, float]:
    """Predicted milliseconds of duplicated and distributed NS (compute + communication) for one matrix."""
    return {mode: tp_cost(rows, cols, tp, hardware, mode, partition_dim=partition_dim,
                          num_steps=num_steps).total_ms
            for mode in ("duplicated", "distributed")}


def choose_tp_mode(rows: int, cols: int, tp: int, hardware: HardwareConfig | str, *, partition_dim: int = 0,
                   num_steps: int = 5) -> str:
    """`tp_mode=auto`: "duplicated" or "distributed" for one TP-sharded rows x cols weight, whichever the model
    predicts faster (duplicated when the per-step Gram all-reduce latency dominates, distributed when the
    duplicated compute does). Ties and tp = 1 give "duplicated" (one collective, bitwise single-GPU result)."""
    hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
    if tp <= 1 or partition_dim < 0:
        return "duplicated"
    t = tp_mode_times(rows, cols, tp, hw, partition_dim=partition_dim, num_steps=num_steps)
    return "distributed" if t["distributed"] < t["duplicated"] else "duplicated"


def load_hardware(name: str) -> HardwareConfig:
    """A hardware row from conf/hardware/<name>.yaml, typed (plain YAML read: no Hydra, cheap enough for an
    optimizer to call at construction)."""
    from omegaconf import OmegaConf

    path = Path(__file__).resolve().parents[2] / "conf" / "hardware" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ValueError(f"hardware={name!r}: must be one of {known}")
    fields = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path)).items() if k != "defaults"}
    return HardwareConfig(**fields)
