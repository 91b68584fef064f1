"""Collective communication times from a hardware row's links (bandwidth-latency, ring algorithms).

A group of `size` GPUs uses NVLink when it fits in one NVLink domain (`hardware.nvlink_domain`) and the scale-out
network otherwise (the slowest link bounds a ring). Bandwidths are per GPU and per direction, in GB/s; efficiencies
and latencies come from `constants`.
"""

from __future__ import annotations

from bench.tools.perfmodel import constants as C
from muonbench.schema import HardwareConfig
from optim import cost
from optim.cost import Link, all_gather, all_reduce, reduce_scatter

__all__ = [
    "Link",
    "all_gather",
    "all_gatherv",
    "all_reduce",
    "all_to_all",
    "group_link",
    "p2p",
    "reduce_scatter",
]


def group_link(hw: HardwareConfig, size: int, *, stride: int = 1) -> Link:
    """The link a group of `size` ranks spaced `stride` apart runs on, from a hardware row (`optim.cost.group_link`)."""
    return cost.group_link(
        size,
        stride=stride,
        nvlink_gbps=hw.nvlink_gbps,
        nvlink_domain=hw.nvlink_domain,
        network_gbps=hw.network_gbps,
        nvlink_latency_us=hw.nvlink_latency_us or C.NVLINK_LATENCY_US.value,
        network_latency_us=hw.network_latency_us or C.NETWORK_LATENCY_US.value,
        nvlink_efficiency=C.NVLINK_EFFICIENCY.value,
        network_efficiency=C.NETWORK_EFFICIENCY.value,
    )


def all_gatherv(nbytes: float, size: int, link: Link) -> float:
    """Variable-size all-gather as NCCL grouped send/recv (MCore legacy layer-wise): ring traffic, but one latency
    per peer and no ring pipelining, i.e. `size - 1` separate messages."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    return (size - 1) / size * nbytes / link.bandwidth + (size - 1) * 2 * link.latency


def all_to_all(nbytes_out: float, size: int, link: Link) -> float:
    """All-to-all where each GPU sends `nbytes_out` in total to its peers (already excluding its own share).

    Runs at the link's collective efficiency (DeepEP/HybridEP reach it, constants.A2A_EFFICIENCY)."""
    if size <= 1 or nbytes_out <= 0:
        return 0.0
    return nbytes_out / link.bandwidth + link.latency


def p2p(nbytes: float, link: Link) -> float:
    """One point-to-point send."""
    if nbytes <= 0:
        return 0.0
    return nbytes / link.bandwidth + link.latency
