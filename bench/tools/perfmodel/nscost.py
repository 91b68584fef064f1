"""Newton-Schulz time per matrix on a hardware row, including the tensor-parallel modes, and `choose_tp_mode`.

GPU time comes from a per-shape efficiency curve measured on our H200 and scaled by the hardware's bf16 GEMM
rate (NS runs bf16 GEMMs under MCore's fp32_matmul_prec "medium"): `optim.distributed.assignment.CostModel`, whose
analytic curve m / (m + 600) of the GEMM ceiling fits the H200 NS measurements (docs/references.md#h200-baseline). The kernel
benchmark's per-shape milliseconds (`calibration.NS_KERNELS`, a data file with provenance) replace the curve
(`ns_data`: EO's NS for `published`, our kernels for `ours`), scaled by the ratio of GEMM rates. Host time of one
call is measured (constants; for our kernels, from the same results).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from bench.tools.perfmodel import constants as C
from bench.tools.perfmodel import hwprofile, links
from bench.tools.perfmodel.calibration import GPU_RUNS, NS_KERNELS
from muonbench.schema import HardwareConfig
from optim import cost
from optim.cost import TPCost
from optim.distributed.assignment import CostModel, canonical

HALF_EFF_DIM = (
    CostModel().half_eff_dim
)  # short side at half the ceiling, fitted to docs/references.md#h200-baseline (assignment.py)


def ns_rate(hw: HardwareConfig, precision: str = "bf16") -> float:
    """Achievable GEMM FLOP/s of NS on this hardware at large shapes: the bf16 rate for a bf16 or fp16 iterate
    (same tensor-core rate), `constants.FP32_NS_RATE_FRACTION` of it for fp32."""
    rate = hw.peak_bf16_tflops * 1e12 * hwprofile.effective(hw).gemm_bf16.value
    return rate * C.FP32_NS_RATE_FRACTION.value if precision == "fp32" else rate


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


def _launches(num_ns_steps: int) -> float:
    return 3 * num_ns_steps + C.NS_CALL_FIXED_LAUNCHES.value


@lru_cache(maxsize=8)
def ns_data(profile: str, path: Path = NS_KERNELS, *, gram: bool = True) -> NSData:
    """NS cost data of a profile: `published` = EO newton_schulz, `ours` = the best of our plan-cached kernels
    (plain or Gram-NS, batched, CUDA graphs for small shapes; plain only with `gram=False`, as
    `optimizer.use_gram_ns=false` keeps the plan to plain NS).

    From the kernel benchmark's data (`calibration.NS_KERNELS`, or any results.json at `path`) when present: a
    batched measurement of B matrices gives (ms - host) / B per matrix, a single one max(ms - host, FLOP floor); times are rescaled
    from that run's GEMM ceiling to 701 TF/s. Our host cost per call is the fastest single-matrix call measured
    (a 128-row router, GPU work ~0). Without the file: the H200 anchor curve and `NS_CALL_HOST_MS` for both.
    """
    anchor_host = C.NS_CALL_HOST_MS.value
    if not path.exists():
        return NSData(
            table={},
            host_ms=anchor_host,
            source="docs/references.md#h200-baseline curve (no kernel results yet)",
        )
    data: Any = json.loads(path.read_text())
    ceiling = float(data.get("ceiling_tflops", C.H200_GEMM_CEILING_TFLOPS.value))
    to_anchor = ceiling / C.H200_GEMM_CEILING_TFLOPS.value
    impls = ("eo_plain",) if profile == "published" else ("ours", "ours_gram") if gram else ("ours",)
    singles = [
        min(float(sh["impls"][i]["ms"]) for i in impls if "ms" in sh["impls"].get(i, {}))
        for sh in data.get("shapes", [])
        if int(sh.get("batch", 1)) == 1 and any("ms" in sh["impls"].get(i, {}) for i in impls)
    ]
    # EO: the lowest host cost measured (constants.NS_CALL_HOST_MS, or the kernel run's smallest single call)
    host = (
        min([anchor_host, *singles]) if profile == "published" else (min(singles) if singles else anchor_host)
    )
    def per_matrix(names: tuple[str, ...]) -> dict[tuple[int, int], float]:
        samples: dict[tuple[int, int], list[float]] = {}
        for sh in data.get("shapes", []):
            times = [float(sh["impls"][i]["ms"]) for i in names if "ms" in sh["impls"].get(i, {})]
            if not times:
                continue
            batch, key = int(sh.get("batch", 1)), canonical((int(sh["rows"]), int(sh["cols"])))
            floor = cost.ns_flops(key[0], key[1]) / (ceiling * 1e12) * 1e3
            per = max((min(times) - host) / batch, floor)  # GPU part per matrix; the host cost is charged per call
            samples.setdefault(key, []).append(per * to_anchor)
        return {k: sum(v) / len(v) for k, v in samples.items()}  # both orientations of a shape (q and o): mean

    table = per_matrix(impls)
    source = f"{path.name} ({data.get('device_name', '?')}, ceiling {ceiling:.0f} TF/s)"
    if profile == "ours" and path == NS_KERNELS:  # the shipped data: the plan's own measurements where it has them
        planned = plan_table(host)  # plain NS (no committed plan allowed Gram-NS)
        plain = per_matrix(("ours",))
        # where the kernel benchmark measured Gram-NS faster than plain, the plan's plain time keeps that ratio
        table.update({k: v * min(1.0, table[k] / plain[k]) if k in plain else v for k, v in planned.items()})
        table = PriorTable(table, planned=planned)
        source += f"; {len(planned)} shapes from the NS plan's measured times (shipped seeds, committed runs)"
        source += ", the others on the plan prior"
    return NSData(table=table, host_ms=host, single_call_ms=tuple(sorted(singles)[:3]), source=source)


class PriorTable(dict[tuple[int, int], float]):
    """Per-shape NS milliseconds (`ns_data`'s table) that answers every shape: one it lacks costs its NS FLOPs at
    the rate our planned kernels reached on the nearest planned shape ((log short side, log long side); the shipped
    seeds and committed runs, all of one compute capability, SM 9.0), as the plan's prior ranks a shape it never
    timed on the timings of its neighbours (`optim.kernels.plan_seed.prior`), instead of the analytic curve."""

    def __init__(self, table: dict[tuple[int, int], float], *, planned: dict[tuple[int, int], float]) -> None:
        super().__init__(table)
        self.planned = planned

    def __contains__(self, key: object) -> bool:
        return bool(self.planned) or super().__contains__(key)

    def __missing__(self, key: tuple[int, int]) -> float:
        m, n = key

        def distance(shape: tuple[int, int]) -> float:
            return math.log(shape[0] / m) ** 2 + math.log(shape[1] / n) ** 2

        near = min(self.planned, key=distance)
        rate = cost.ns_flops(*near) / self.planned[near]  # FLOP per ms at the H200 ceiling
        self[key] = cost.ns_flops(m, n) / rate
        return self[key]


PLAN_SEEDS = Path(__file__).resolve().parents[3] / "optim" / "kernels" / "plan_seeds"
"""`optim.kernels.plan_seed.SEED_DIR`, read here as files (that package imports torch)."""
_SHAPE = re.compile(r"\|(\d+)x(\d+)x(\d+)\|")


def plan_entries() -> dict[str, float]:
    """Measured milliseconds of the chosen method per NS plan key: the shipped seeds, then the plan entries of the
    committed GPU runs (`calibration.GPU_RUNS`: measured in full, on a prior, or adopted from a seed)."""
    out: dict[str, float] = {}
    for path in sorted(PLAN_SEEDS.glob("*.json")):
        for key, entry in json.loads(path.read_text())["entries"].items():
            out[key] = float(entry["times_ms"][entry["method"]])
    if GPU_RUNS.exists():
        for run in json.loads(GPU_RUNS.read_text()).get("runs", []):
            out.update(run.get("ns_plan_ms") or {})
    return out


@lru_cache(maxsize=4)
def plan_table(host_ms: float) -> dict[tuple[int, int], float]:
    """Per canonical shape, the GPU milliseconds per matrix of one planned NS call measured by the plan on H200:
    (ms - host_ms) / batch (at least the FLOP floor), the mean over the entries of that shape (plain NS: plans
    without Gram-NS)."""
    return table_of(plan_entries(), host_ms, C.H200_GEMM_CEILING_TFLOPS.value)


def table_of(entries: dict[str, float], host_ms: float, ceiling_tflops: float) -> dict[tuple[int, int], float]:
    """`plan_table` of plan entries (plan key -> ms) measured on a GPU whose dense GEMMs reach `ceiling_tflops`,
    normalised to the H200 GEMM ceiling."""
    to_anchor = ceiling_tflops / C.H200_GEMM_CEILING_TFLOPS.value
    samples: dict[tuple[int, int], list[float]] = {}
    for key, ms in entries.items():
        found = _SHAPE.search(key)
        if found is None or "|gram=True|" in key:
            continue
        batch, rows, cols = (int(g) for g in found.groups())
        shape = canonical((rows, cols))
        floor = cost.ns_flops(shape[0], shape[1]) / (ceiling_tflops * 1e12) * 1e3
        samples.setdefault(shape, []).append(max((ms - host_ms) / batch, floor) * to_anchor)
    return {k: sum(v) / len(v) for k, v in samples.items()}


def hardware_table(hw: HardwareConfig, profile: str, *, gram: bool = True) -> dict[tuple[int, int], float]:
    """`measured_table` with the NS plan times of the hardware profile of `hw` (`hwprofile.select`) in place of the
    H200 ones for the shapes it measured (our kernels only: the plan times are ours)."""
    table = measured_table(profile, gram=gram)
    prof = hwprofile.select(hw.name)
    if prof is None or not prof.ns_plan_ms or profile != "ours":
        return table
    return {**table, **table_of(prof.ns_plan_ms, ns_data(profile, gram=gram).host_ms, prof.tflops["dense"])}


def host_call_ms(hw: HardwareConfig, num_ns_steps: int = 5, profile: str = "published") -> float:
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
    return base * _launches(num_ns_steps) / _launches(5)


def measured_table(profile: str = "ours", *, gram: bool = True) -> dict[tuple[int, int], float]:
    """Per-shape measured milliseconds per matrix (normalised to 701 TF/s); {} without kernel results."""
    return ns_data(profile, gram=gram).table


def gpu_ms(
    rows: float,
    cols: float,
    hw: HardwareConfig,
    *,
    num_ns_steps: int = 5,
    convention: str = "plain",
    table: dict[tuple[int, int], float] | None = None,
) -> float:
    """GPU milliseconds of NS on one rows x cols matrix on a hardware row (`optim.cost.gpu_ms`): a measured shape
    (normalised to the H200 GEMM ceiling) or the curve m / (m + 600) of the GEMM ceiling."""
    return cost.gpu_ms(
        rows,
        cols,
        flops_per_s=ns_rate(hw),
        num_ns_steps=num_ns_steps,
        convention=convention,
        table=table,
        table_flops_per_s=C.H200_GEMM_CEILING_TFLOPS.value * 1e12,
    )


def tp_cost(
    rows: int,
    cols: int,
    tp: int,
    hw: HardwareConfig,
    mode: str,
    *,
    partition_dim: int = 0,
    num_ns_steps: int = 5,
    convention: str = "plain",
    triangular: bool = False,
    table: dict[tuple[int, int], float] | None = None,
    precision: str = "bf16",
) -> TPCost:
    """NS cost of one TP-sharded matrix under `mode` on a hardware row (`optim.cost.tp_cost`, TP group link) with
    an iterate of `precision` (`ns_rate`; measured bf16 times rescaled by the rate)."""
    return cost.tp_cost(
        rows,
        cols,
        tp,
        mode,
        flops_per_s=ns_rate(hw, precision),
        link=links.group_link(hw, tp),
        partition_dim=partition_dim,
        num_ns_steps=num_ns_steps,
        convention=convention,
        triangular=triangular,
        table=table,
        table_flops_per_s=C.H200_GEMM_CEILING_TFLOPS.value * 1e12,
    )


def tp_mode_times(
    rows: int, cols: int, tp: int, hardware: HardwareConfig, *, partition_dim: int = 0, num_ns_steps: int = 5
) -> dict[str, float]:
    """Predicted milliseconds of duplicated and distributed NS (compute + communication) for one matrix."""
    return cost.tp_mode_times(
        rows,
        cols,
        tp,
        flops_per_s=ns_rate(hardware),
        link=links.group_link(hardware, tp),
        partition_dim=partition_dim,
        num_ns_steps=num_ns_steps,
    )


def choose_tp_mode(
    rows: int,
    cols: int,
    tp: int,
    hardware: HardwareConfig | str,
    *,
    partition_dim: int = 0,
    num_ns_steps: int = 5,
) -> str:
    """`optim.cost.choose_tp_mode` on a hardware row (or its name): the choice the optimizer makes at
    `tp_mode=auto`."""
    hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
    return cost.choose_tp_mode(
        rows,
        cols,
        tp,
        flops_per_s=ns_rate(hw),
        link=links.group_link(hw, tp),
        partition_dim=partition_dim,
        num_ns_steps=num_ns_steps,
    )


def load_hardware(name: str) -> HardwareConfig:
    """A hardware row from conf/hardware/<name>.yaml, typed (plain YAML read: no Hydra, cheap enough for an
    optimizer to call at construction)."""
    from omegaconf import OmegaConf

    path = Path(__file__).resolve().parents[3] / "conf" / "hardware" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ValueError(f"hardware={name!r}: must be one of {known}")
    fields = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path)).items() if k != "defaults"}
    return HardwareConfig(**fields)
