"""The optimizer's own cost model: Newton-Schulz (NS) FLOPs and the tensor-parallel NS mode choice.

NS FLOPs count the matmuls of k NS steps on one m x n matrix, m the short side:

- plain: k * (4 m^2 n + 2 m^3)   (A = X X^T: 2 m^2 n; B = bA + cA^2: 2 m^3; X <- aX + BX: 2 m^2 n)
- syrk:  k * (3 m^2 n + m^3)     (one triangle of the symmetric products X X^T and A A)
- gram:  3 s m^2 n + (4 k - 3 s) m^3   (Gram-NS: iterate on the m x m Gram matrix; s = 1 + restarts segments,
  each costing one SYRK Gram m^2 n and one Q X product 2 m^2 n, a segment of L steps costs (4 L - 3) m^3 with
  symmetric products; k = 5 with a restart after step 2 gives 6 m^2 n + 14 m^3)

Norms, casts, momentum and scaling are memory-bound and not counted.

`choose_tp_mode` (`tp_mode=auto`) compares the predicted time of duplicated and distributed NS for one
TP-sharded weight: GPU time from the FLOP count at a short-side dependent fraction m / (m + 600) of the achievable
GEMM rate (fitted to H200 NS measurements, docs/references.md#h200-baseline), communication
from ring collectives on the group's link. The performance model (`bench.tools.perfmodel`) uses the same functions.
Imports nothing but the standard library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optim.configs import TP_MODES

CONVENTIONS: tuple[str, ...] = ("plain", "syrk", "gram")
FORMULAS: dict[str, str] = {
    "plain": "k*(4*m^2*n + 2*m^3)",
    "syrk": "k*(3*m^2*n + m^3)",
    "gram": "3*s*m^2*n + (4*k - 3*s)*m^3, s = 1 + restarts (k=5, restart after step 2: 6*m^2*n + 14*m^3)",
}

GEMM_CEILINGS: dict[str, dict[str, Any]] = json.loads(Path(__file__).with_name("gemm_ceilings.json").read_text())
"""Measured dense bf16 GEMM ceilings by GPU, with their datasheet peaks and sources (`optim/gemm_ceilings.json`)."""
GEMM_CEILING_TFLOPS: float = GEMM_CEILINGS["nvidia_h200"]["bf16_tflops"]
"""Our measured H200 dense bf16 GEMM ceiling (TF/s; docs/references.md#h200-baseline)."""
GEMM_CEILING_FRACTION = GEMM_CEILING_TFLOPS / GEMM_CEILINGS["nvidia_h200"]["datasheet_bf16_tflops"]
"""Achievable fraction of the dense bf16 datasheet peak: our measured H200 bf16 GEMM ceiling over the datasheet
peak."""
HALF_EFF_DIM = 600.0
"""Short side at which one NS call reaches half the GEMM ceiling (fitted to docs/references.md#h200-baseline)."""
LINK_EFFICIENCY = 0.9
"""Bus bandwidth of NCCL collectives as a fraction of the link's per-direction rate (nccl-tests)."""
NVLINK_LATENCY_US = 3.0
"""Small-message collective latency inside one NVLink domain (nccl-tests)."""
NETWORK_LATENCY_US = 8.0
"""RDMA all-reduce latency across nodes (nccl-tests)."""


# --------------------------------------------------------------------------------------------------------------
# NS FLOPs
# --------------------------------------------------------------------------------------------------------------
def ns_flops_mn(
    m: float,
    n: float,
    num_ns_steps: int,
    convention: str = "plain",
    restart_iterations: tuple[int, ...] = (2,),
) -> float:
    """NS FLOPs with the Gram side m given explicitly (m x m Gram, contracted over n); see module doc."""
    k, m, n = num_ns_steps, float(m), float(n)
    if convention == "plain":
        return k * (4 * m * m * n + 2 * m**3)
    if convention == "syrk":
        return k * (3 * m * m * n + m**3)
    if convention == "gram":
        segments = 1 + sum(1 for r in set(restart_iterations) if 0 < r < k)
        return 3 * segments * m * m * n + (4 * k - 3 * segments) * m**3
    raise ValueError(f"convention={convention!r}: must be one of {list(CONVENTIONS)}")


def ns_flops(
    rows: int,
    cols: int,
    num_ns_steps: int = 5,
    convention: str = "plain",
    *,
    restart_iterations: tuple[int, ...] = (2,),
) -> float:
    """FLOPs of `num_ns_steps` NS steps on one rows x cols matrix (transposed so that m = min side); see module doc."""
    if rows < 1 or cols < 1:
        raise ValueError(f"rows x cols={rows}x{cols}: both sides must be >= 1")
    if num_ns_steps < 1:
        raise ValueError(f"num_ns_steps={num_ns_steps}: must be >= 1")
    return ns_flops_mn(min(rows, cols), max(rows, cols), num_ns_steps, convention, restart_iterations)


# --------------------------------------------------------------------------------------------------------------
# Links and ring collectives
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    """Effective bandwidth (bytes/s) and per-message latency (s) of a group's slowest hop."""

    bandwidth: float
    latency: float
    kind: str
    """`nvlink`, `network` or `local` (group of one)."""


def group_link(
    size: int,
    *,
    stride: int = 1,
    nvlink_gbps: float,
    nvlink_domain: int,
    network_gbps: float,
    nvlink_latency_us: float = 0.0,
    network_latency_us: float = 0.0,
    nvlink_efficiency: float = LINK_EFFICIENCY,
    network_efficiency: float = LINK_EFFICIENCY,
) -> Link:
    """The link a group of `size` ranks spaced `stride` apart in the global rank order runs on.

    Megatron orders ranks tp-cp-ep-dp-pp, so a group with stride s spans size * s consecutive ranks; it stays inside
    one NVLink domain when that span fits in `nvlink_domain` GPUs. Bandwidths are per GPU and direction (GB/s);
    a latency of 0 takes the default of its link kind.
    """
    if size <= 1:
        return Link(bandwidth=float("inf"), latency=0.0, kind="local")
    if size * stride <= max(1, nvlink_domain):
        lat = (nvlink_latency_us or NVLINK_LATENCY_US) * 1e-6
        return Link(bandwidth=nvlink_gbps * 1e9 * nvlink_efficiency, latency=lat, kind="nvlink")
    lat = (network_latency_us or NETWORK_LATENCY_US) * 1e-6
    return Link(bandwidth=network_gbps * 1e9 * network_efficiency, latency=lat, kind="network")


def reduce_scatter(nbytes: float, size: int, link: Link) -> float:
    """Ring reduce-scatter of a `nbytes` buffer: (n-1)/n of it crosses each GPU's link, n-1 latency hops."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    return (size - 1) / size * nbytes / link.bandwidth + (size - 1) * link.latency


def all_gather(nbytes: float, size: int, link: Link) -> float:
    """Ring all-gather producing a `nbytes` buffer on every rank (same traffic as reduce-scatter)."""
    return reduce_scatter(nbytes, size, link)


def all_reduce(nbytes: float, size: int, link: Link) -> float:
    """Ring all-reduce = reduce-scatter + all-gather: 2 (n-1)/n of the buffer per GPU."""
    return 2.0 * reduce_scatter(nbytes, size, link)


# --------------------------------------------------------------------------------------------------------------
# NS time of one (TP-sharded) matrix
# --------------------------------------------------------------------------------------------------------------
def gpu_ms(
    rows: float,
    cols: float,
    *,
    flops_per_s: float,
    num_ns_steps: int = 5,
    convention: str = "plain",
    table: dict[tuple[int, int], float] | None = None,
    table_flops_per_s: float = 0.0,
) -> float:
    """GPU milliseconds of NS on one rows x cols matrix (short side m) at an achievable GEMM rate `flops_per_s`:
    a measured shape of `table` (milliseconds at `table_flops_per_s`, 5 steps; scaled by FLOPs for other step
    counts) or the curve m / (m + HALF_EFF_DIM) of the rate."""
    m, n = min(rows, cols), max(rows, cols)
    key = (int(m), int(n))
    if table and key in table:
        scale = ns_flops(key[0], key[1], num_ns_steps) / ns_flops(key[0], key[1], 5)
        return table[key] * scale * table_flops_per_s / flops_per_s
    flop = ns_flops(max(1, int(m)), max(1, int(n)), num_ns_steps, convention)
    return flop / (flops_per_s * m / (m + HALF_EFF_DIM)) * 1e3


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
    mode: str,
    *,
    flops_per_s: float,
    link: Link,
    partition_dim: int = 0,
    num_ns_steps: int = 5,
    convention: str = "plain",
    triangular: bool = False,
    table: dict[tuple[int, int], float] | None = None,
    table_flops_per_s: float = 0.0,
) -> TPCost:
    """NS cost of one TP-sharded matrix under `mode` (optim.distributed.tp_orthogonalize.TPMode semantics).

    duplicated: all-gather of the fp32 shards, full NS on every rank. distributed: the sharded dim is contracted;
    k all-reduces of the unsharded-side Gram (bf16; half the bytes when `triangular`) plus one for the norm, A^2
    redundant on every rank; if the short side is sharded, NS runs on the long side. distributed_gram: the same with
    Gram-NS, 1 + restarts all-reduces. blockwise: each shard alone.
    """
    if mode not in TP_MODES:
        raise ValueError(f"tp_mode={mode!r}: must be one of {list(TP_MODES)}")

    def gpu(r: float, c: float) -> float:
        return gpu_ms(
            r,
            c,
            flops_per_s=flops_per_s,
            num_ns_steps=num_ns_steps,
            convention=convention,
            table=table,
            table_flops_per_s=table_flops_per_s,
        )

    if tp <= 1 or partition_dim < 0:
        return TPCost(compute_ms=gpu(rows, cols), comm_ms=0.0)
    split, other = (rows, cols) if partition_dim == 0 else (cols, rows)
    if mode == "blockwise":
        return TPCost(compute_ms=gpu(split / tp, other), comm_ms=0.0)
    if mode == "duplicated":
        return TPCost(compute_ms=gpu(rows, cols), comm_ms=all_gather(rows * cols * 4.0, tp, link) * 1e3)
    conv = "gram" if mode == "distributed_gram" else convention
    flop = ns_flops_mn(other, split / tp, num_ns_steps, conv, (2,))
    m_eff = min(other, split / tp)
    compute = flop / (flops_per_s * m_eff / (m_eff + HALF_EFF_DIM)) * 1e3
    gram_bytes = other * other * 2.0 * (0.5 if triangular else 1.0)
    if mode == "distributed_gram":  # R_0 once and one re-formed Gram at the restart; norm from trace(R_0)
        comm = 2 * all_reduce(gram_bytes, tp, link)
    else:  # one Gram all-reduce per step plus the scalar norm
        comm = num_ns_steps * all_reduce(gram_bytes, tp, link) + all_reduce(4.0, tp, link)
    return TPCost(compute_ms=compute, comm_ms=comm * 1e3)


def tp_mode_times(
    rows: int,
    cols: int,
    tp: int,
    *,
    flops_per_s: float,
    link: Link,
    partition_dim: int = 0,
    num_ns_steps: int = 5,
) -> dict[str, float]:
    """Predicted milliseconds of duplicated and distributed NS (compute + communication) for one matrix."""
    return {
        mode: tp_cost(
            rows,
            cols,
            tp,
            mode,
            flops_per_s=flops_per_s,
            link=link,
            partition_dim=partition_dim,
            num_ns_steps=num_ns_steps,
        ).total_ms
        for mode in ("duplicated", "distributed")
    }


def choose_tp_mode(
    rows: int,
    cols: int,
    tp: int,
    *,
    flops_per_s: float,
    link: Link,
    partition_dim: int = 0,
    num_ns_steps: int = 5,
) -> str:
    """`tp_mode=auto`: "duplicated" or "distributed" for one TP-sharded rows x cols weight, whichever is predicted
    faster (duplicated when the per-step Gram all-reduce latency dominates, distributed when the duplicated compute
    does). Ties and tp = 1 give "duplicated" (one collective, bitwise single-GPU result)."""
    if tp <= 1 or partition_dim < 0:
        return "duplicated"
    t = tp_mode_times(
        rows,
        cols,
        tp,
        flops_per_s=flops_per_s,
        link=link,
        partition_dim=partition_dim,
        num_ns_steps=num_ns_steps,
    )
    return "distributed" if t["distributed"] < t["duplicated"] else "duplicated"
