"""Where one training step's GPU time goes: a torch.profiler capture of one step, summarised per phase.

The engines mark their phases with `torch.profiler.record_function` ranges named `muonbench/<phase>` (`fwd_bwd`,
`optim`; `phase_range` below). `profile_step(fn)` runs `fn()` (one engine step) under the profiler and returns its
result and the capture; `summarize(events, phase_wall_s)` turns the capture's events into:

- per phase: kernel time (device time of every kernel launched inside the phase's range, children included) next to
  the phase's wall time from the engine's CUDA events, and their difference, the time the GPU waited on the host
  (launch gaps, host syncs, Python) as far as one stream goes; `gpu_span_s` is the range's own GPU-side annotation
  where the profiler records one;
- the top kernels of the step by total device time (name, calls, ms).

Two runs of the same model with different optimizers then show whether a forward-backward difference is kernel
time (the GPU ran slower) or gaps (the host was late). `write(run_dir, step, summary)` stores it as
`profile_step<k>.json` next to the run record.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

PREFIX = "muonbench/"
TOP_KERNELS = 40


def phase_range(name: str) -> AbstractContextManager[Any]:
    """`record_function("muonbench/<name>")` (a no-op outside a profiler capture, cheap inside)."""
    try:
        from torch.profiler import record_function
    except ImportError:  # pragma: no cover - torch always has it
        return nullcontext()
    return record_function(PREFIX + name)


def profile_step[T](fn: Callable[[], T], *, cuda: bool) -> tuple[T, Any]:
    """Run `fn()` under torch.profiler (CPU, plus CUDA activity when `cuda`); returns (result, profiler)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        out = fn()
    return out, prof


def _on_device(ev: Any) -> bool:
    dev = getattr(ev, "device_type", None)
    return dev is not None and "CUDA" in str(dev)


def _is_kernel(ev: Any) -> bool:
    return _on_device(ev) and not str(getattr(ev, "name", "")).startswith(PREFIX)


def _device_time_us(ev: Any) -> float:
    for attr in ("device_time_total", "cuda_time_total"):
        v = getattr(ev, attr, None)
        if v is not None:
            return float(v)
    return 0.0


def summarize(events: Iterable[Any], phase_wall_s: dict[str, float] | None = None) -> dict[str, Any]:
    """Per-phase kernel time vs wall time and the top kernels, from profiler `events` (FunctionEvent-like: name,
    device_type, device_time_total in us, count-free; phase ranges are CPU events named `muonbench/<phase>` whose
    device_time_total covers the kernels launched inside them)."""
    phase_wall_s = phase_wall_s or {}
    phases: dict[str, dict[str, float | None]] = {}
    kernels: dict[str, list[float]] = {}
    kernel_total_us = 0.0
    for ev in events:
        name = str(ev.name)
        if name.startswith(PREFIX):
            ph = name[len(PREFIX) :]
            cur = phases.setdefault(ph, {"kernel_s": 0.0})
            if _on_device(ev):  # the range's GPU-side annotation: its span on the stream, not kernel time
                cur["gpu_span_s"] = float(cur.get("gpu_span_s") or 0.0) + _device_time_us(ev) / 1e6
            else:
                cur["kernel_s"] = float(cur["kernel_s"] or 0.0) + _device_time_us(ev) / 1e6
        elif _is_kernel(ev):
            t = (
                _device_time_us(ev)
                if _device_time_us(ev)
                else float(getattr(ev, "self_device_time_total", 0.0))
            )
            kernels.setdefault(name, []).append(t)
            kernel_total_us += t
    for ph, cur in phases.items():
        wall = phase_wall_s.get(ph)
        cur["wall_s"] = wall
        cur["gap_s"] = None if wall is None else wall - float(cur["kernel_s"] or 0.0)
    top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:TOP_KERNELS]
    return {
        "phases": phases,
        "kernel_total_s": kernel_total_us / 1e6,
        "top_kernels": [{"name": n[:160], "calls": len(ts), "total_ms": sum(ts) / 1e3} for n, ts in top],
    }


def write(run_dir: str | Path, step: int, summary: dict[str, Any]) -> Path:
    """`<run_dir>/profile_step<step>.json` (atomic)."""
    from bench.record import write_json_atomic

    path = Path(run_dir) / f"profile_step{step}.json"
    write_json_atomic(path, summary)
    return path


def main_table(summary: dict[str, Any]) -> str:
    """One-line-per-phase text view of a summary (for logs)."""
    rows = []
    for ph, cur in sorted(summary["phases"].items()):
        wall = cur.get("wall_s")
        gap = cur.get("gap_s")
        rows.append(
            f"{ph:>8}: kernels {cur['kernel_s']:.3f} s"
            + (
                f", wall {wall:.3f} s, host-side gap {gap:.3f} s"
                if wall is not None and gap is not None
                else ""
            )
        )
    return "\n".join(rows) + "\n" + json.dumps(summary["top_kernels"][:5])
