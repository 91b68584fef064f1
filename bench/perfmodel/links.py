"""Collective communication times from a hardware row's links (bandwidth-latency, ring algorithms).

A group of `size` GPUs uses NVLink when it fits in one NVLink domain (`hardware.nvlink_domain`) and the scale-out
network otherwise (the slowest link bounds a ring). Bandwidths are per GPU and per direction, in GB/s; efficiencies
and latencies come from `constants`.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.perfmodel import constants as C
from config.schema import HardwareConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    """Effective bandwidth (bytes/s) and per-message latency (s) of a group's slowest hop."""

    bandwidth: float
    latency: float
    kind: str
    """`nvlink`, `network` or `local` (group of one)."""


def group_link(hw: HardwareConfig, size: int, *, stride: int = 1) -> Link:
    """The link a group of `size` ranks spaced `stride` apart in the global rank order runs on.

    Megatron orders ranks tp-cp-ep-dp-pp, so a group with stride s spans size * s consecutive ranks; it stays inside
    one NVLink domain when that span fits in `hw.nvlink_domain` GPUs.
    """
    if size <= 1:
        return Link(bandwidth=float("inf"), latency=0.0, kind="local")
    if size * stride <= max(1, hw.nvlink_domain):
        lat = (hw.nvlink_latency_us or C.NVLINK_LATENCY_US.value) * 1e-6
        return Link(bandwidth=hw.nvlink_gbps * 1e9 * C.NVLINK_EFFICIENCY.value, latency=lat, kind="nvlink")
    lat = (hw.network_latency_us or C.NETWORK_LATENCY_US.value) * 1e-6
    return Link(bandwidth=hw.network_gbps * 1e9 * C.NETWORK_EFFICIENCY.value, latency=lat, kind="network")


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
