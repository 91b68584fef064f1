"""Newton-Schulz time per matrix on a hardware row, including the tensor-parallel modes, and `choose_tp_mode`.

GPU time comes from a per-shape efficiency curve measured on our H200 and scaled by the hardware's bf16 GEMM
rate (NS runs bf16 GEMMs under MCore's fp32_matmul_prec "medium"): `optim.distributed.assignment.CostModel`, whose
analytic curve m / (m + 600) of the GEMM ceiling fits the H200 NS measurements (anchors.md f). When the kernel
benchmark has written `reports/ns_kernels_h200_202611/results.json`, its per-shape milliseconds replace the curve
(`ns_data`: EO's NS for `published`, our kernels for `ours`), scaled by the ratio of GEMM rates. Host time of one
call is measured (constants; for our kernels, from the same results).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from bench import flops
from bench.perfmodel import constants as C
from bench.perfmodel import links
from config.schema import HardwareConfig
from optim.distributed.assignment import CostModel, canonical

KERNEL_RESULTS = Path(__file__).resolve().parents[2] / "reports" / "ns_kernels_h200_202611" / "results.json"
TP_MODES = ("duplicated", "distributed", "distributed_gram", "blockwise")
HALF_EFF_DIM = (
    CostModel().half_eff_dim
)  # short side at half the ceiling, fitted to anchors.md f (assignment.py)


def ns_rate(hw: HardwareConfig) -> float:
    """Achievable bf16 GEMM FLOP/s of NS on this hardware at large shapes."""
    return hw.peak_bf16_tflops * 1e12 * C.efficiency(hw.name).gemm_bf16.value


@dataclass(frozen=True, kw_only=True, slots=True)
class NSData:
    """Measured H200 NS milliseconds per matrix, normalised to our H200 GEMM ceiling (701 TF/s), by canonical
    (short, long) shape, and the host cost of one call of that implementation."""

    table: dict[tuple[int, int], float]
    host_ms: float
    single_call_ms: tuple[float, ...] = ()
    """Fastest single-matrix calls of the implementation in the kernel run (host-bound shapes)."""
    source: str


HOST_OVERRIDE_MS: dict[str, float] = {}
"""Per-profile host cost per NS call replacing the measured one (sensitivity studies only)."""


def _launches(num_steps: int) -> float:
    return 3 * num_steps + C.NS_CALL_FIXED_LAUNCHES.value


@lru_cache(maxsize=4)
def ns_data(profile: str, path: Path = KERNEL_RESULTS) -> NSData:
    """NS cost data of a profile: `published` = EO newton_schulz, `ours` = the best of our plan-cached kernels
    (plain or Gram-NS, batched, CUDA graphs for small shapes).

    From the kernel benchmark (`reports/ns_kernels_h200_202611/results.json`) when present: a batched measurement
    of B matrices gives (ms - host) / B per matrix, a single one max(ms - host, FLOP floor); times are rescaled
    from that run's GEMM ceiling to 701 TF/s. Our host cost per call is the fastest single-matrix call measured
    (a 128-row router, GPU work ~0). Without the file: the H200 anchor curve and `NS_CALL_HOST_MS` for both.
    """
    anchor_host = C.NS_CALL_HOST_MS.value
    if not path.exists():
        return NSData(table={}, host_ms=anchor_host, source="anchors.md f curve (no kernel results yet)")
    data: Any = json.loads(path.read_text())
    ceiling = float(data.get("ceiling_tflops", C.H200_GEMM_CEILING_TFLOPS.value))
    to_anchor = ceiling / C.H200_GEMM_CEILING_TFLOPS.value
    impls = ("eo_plain",) if profile == "published" else ("ours", "ours_gram")
    singles = [
        min(float(sh["impls"][i]["ms"]) for i in impls if "ms" in sh["impls"].get(i, {}))
        for sh in data.get("shapes", [])
        if int(sh.get("batch", 1)) == 1 and any("ms" in sh["impls"].get(i, {}) for i in impls)
    ]
    # EO: the lowest host cost measured (anchors: 0.330 and 0.475 ms; kernel run: its smallest single call)
    host = (
        min([anchor_host, *singles]) if profile == "published" else (min(singles) if singles else anchor_host)
    )
    samples: dict[tuple[int, int], list[float]] = {}
    for sh in data.get("shapes", []):
        times = [float(sh["impls"][i]["ms"]) for i in impls if "ms" in sh["impls"].get(i, {})]
        if not times:
            continue
        batch, key = int(sh.get("batch", 1)), canonical((int(sh["rows"]), int(sh["cols"])))
        floor = flops.ns_flops(key[0], key[1]) / (ceiling * 1e12) * 1e3
        per = max(
            (min(times) - host) / batch, floor
        )  # GPU part per matrix; the host cost is charged per call
        samples.setdefault(key, []).append(per * to_anchor)
    table = {k: sum(v) / len(v) for k, v in samples.items()}  # both orientations of a shape (q and o): mean
    source = f"{path.name} ({data.get('device_name', '?')}, ceiling {ceiling:.0f} TF/s)"
    return NSData(table=table, host_ms=host, single_call_ms=tuple(sorted(singles)[:3]), source=source)


def host_call_ms(hw: HardwareConfig, num_steps: int = 5, profile: str = "published") -> float:
    """Host milliseconds of one NS call when launch-bound, scaled from 5 steps by the launch count 3 k + fixed.

    published: one EO call per matrix inside Megatron's Muon loop, measured per hardware row's host
    (`constants.FITTED[...].eo_loop_ms`); ours: one batched call of our kernels (CUDA graphs for small shapes),
    measured by the kernel benchmark on H200 (assumed for every host).
    """
    if profile in HOST_OVERRIDE_MS:
        base = HOST_OVERRIDE_MS[profile]
    elif profile == "published":
        base = C.efficiency(hw.name).eo_loop_ms.value
    else:
        base = ns_data(profile).host_ms
    return base * _launches(num_steps) / _launches(5)


def measured_table(profile: str = "ours") -> dict[tuple[int, int], float]:
    """Per-shape measured milliseconds per matrix (normalised to 701 TF/s); {} without kernel results."""
    return ns_data(profile).table


def gpu_ms(
    rows: float,
    cols: float,
    hw: HardwareConfig,
    *,
    num_steps: int = 5,
    convention: str = "plain",
    table: dict[tuple[int, int], float] | None = None,
) -> float:
    """GPU milliseconds of NS on one rows x cols matrix (short side m, Gram m x m): a measured shape (its kernel's
    own method, scaled by FLOPs for other step counts) or the curve m / (m + 600) of the GEMM ceiling."""
    m, n = min(rows, cols), max(rows, cols)
    key = (int(m), int(n))
    if table and key in table:
        scale = flops.ns_flops(key[0], key[1], num_steps) / flops.ns_flops(key[0], key[1], 5)
        return table[key] * scale * C.H200_GEMM_CEILING_TFLOPS.value * 1e12 / ns_rate(hw)
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


def tp_cost(
    rows: int,
    cols: int,
    tp: int,
    hw: HardwareConfig,
    mode: str,
    *,
    partition_dim: int = 0,
    num_steps: int = 5,
    convention: str = "plain",
    triangular: bool = False,
    table: dict[tuple[int, int], float] | None = None,
) -> TPCost:
    """NS cost of one TP-sharded matrix under `mode` (optim.distributed.tp_orthogonalize.TPMode semantics).

    duplicated: all-gather of the fp32 shards, full NS on every rank. distributed: the sharded dim is contracted;
    k all-reduces of the unsharded-side Gram (bf16; half the bytes when `triangular`) plus one for the norm, A^2
    redundant on every rank; if the short side is sharded, NS runs on the long side. distributed_gram: the same with
    Gram-NS, 1 + restarts all-reduces. blockwise: each shard alone.
    """
    if mode not in TP_MODES:
        raise ValueError(f"tp_mode={mode!r}: must be one of {list(TP_MODES)}")
    if tp <= 1 or partition_dim < 0:
        return TPCost(
            compute_ms=gpu_ms(rows, cols, hw, num_steps=num_steps, convention=convention, table=table),
            comm_ms=0.0,
        )
    link = links.group_link(hw, tp)
    split, other = (rows, cols) if partition_dim == 0 else (cols, rows)
    if mode == "blockwise":
        return TPCost(
            compute_ms=gpu_ms(split / tp, other, hw, num_steps=num_steps, convention=convention, table=table),
            comm_ms=0.0,
        )
    if mode == "duplicated":
        comm = links.all_gather(rows * cols * 4.0, tp, link) * 1e3
        return TPCost(
            compute_ms=gpu_ms(rows, cols, hw, num_steps=num_steps, convention=convention, table=table),
            comm_ms=comm,
        )
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


def tp_mode_times(
    rows: int, cols: int, tp: int, hardware: HardwareConfig, *, partition_dim: int = 0, num_steps: int = 5
) -> dict[str, float]:
    """Predicted milliseconds of duplicated and distributed NS (compute + communication) for one matrix."""
    return {
        mode: tp_cost(
            rows, cols, tp, hardware, mode, partition_dim=partition_dim, num_steps=num_steps
        ).total_ms
        for mode in ("duplicated", "distributed")
    }


def choose_tp_mode(
    rows: int,
    cols: int,
    tp: int,
    hardware: HardwareConfig | str,
    *,
    partition_dim: int = 0,
    num_steps: int = 5,
) -> str:
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
