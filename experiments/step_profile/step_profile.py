"""Where one training step's GPU time goes: a torch.profiler capture of one step, summarised per phase.

The engines mark their phases with `torch.profiler.record_function` ranges named `muonbench/<phase>` (`fwd_bwd`,
`optim`; `bench.timing.phase_range`). `profile_step(fn)` runs `fn()` (one engine step) under the profiler and returns its
result and the capture; `summarize(events, phase_wall_s)` turns the capture's events into:

- per phase: kernel time (device time of every kernel launched inside the phase's range, children included) next to
  the phase's wall time from the engine's CUDA events, and their difference, the time the GPU waited on the host
  (launch gaps, host syncs, Python) as far as one stream goes. Only kernels launched from the range's own host
  thread count: autograd runs the backward on its own thread, so a forward-backward's `kernel_s` holds the forward
  only and its `gap_s` overstates the wait; `timeline` below measures per GPU window instead; `gpu_span_s` is the range's own GPU-side annotation
  where the profiler records one;
- the top kernels of the step by total device time (name, calls, ms);
- `timeline`: where kernel events carry start/end times (torch.profiler's do), per phase window (the range's
  GPU-side annotation) the GPU's busy and idle time, idle gaps by size class, the largest gaps with the kernels on
  either side, and the phase's top kernels: a forward-backward that is slower with the same kernels shows up as
  idle time here, one with slower kernels in its kernel table.

Two runs of the same model with different optimizers then show whether a forward-backward difference is kernel
time (the GPU ran slower) or gaps (the host was late). `write(run_dir, step, summary)` stores it as
`profile_step<k>.json` next to the run record.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench.results.record import write_json_atomic
from bench.timing import PHASE_PREFIX, phase_range

__all__ = ["phase_range", "profile_step", "summarize", "write"]

PREFIX = PHASE_PREFIX
TOP_KERNELS = 40


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


def device_time_us(ev: Any) -> float:
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
                cur["gpu_span_s"] = float(cur.get("gpu_span_s") or 0.0) + device_time_us(ev) / 1e6
            else:
                cur["kernel_s"] = float(cur["kernel_s"] or 0.0) + device_time_us(ev) / 1e6
        elif _is_kernel(ev):
            t = (
                device_time_us(ev)
                if device_time_us(ev)
                else float(getattr(ev, "self_device_time_total", 0.0))
            )
            kernels.setdefault(name, []).append(t)
            kernel_total_us += t
    for ph, cur in phases.items():
        wall = phase_wall_s.get(ph)
        cur["wall_s"] = wall
        cur["gap_s"] = None if wall is None else wall - float(cur["kernel_s"] or 0.0)
    return {
        "phases": phases,
        "kernel_total_s": kernel_total_us / 1e6,
        "top_kernels": _top(kernels),
        "timeline": timeline(events),
    }


def _top(kernels: dict[str, list[float]], n: int = TOP_KERNELS) -> list[dict[str, Any]]:
    top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:n]
    return [{"name": k[:160], "calls": len(ts), "total_ms": sum(ts) / 1e3} for k, ts in top]


GAP_CLASSES_US = (10.0, 100.0, 1000.0)
TOP_GAPS = 15


def _span(ev: Any) -> tuple[float, float] | None:
    tr = getattr(ev, "time_range", None)
    if tr is None:
        return None
    return float(tr.start), float(tr.end)


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping or touching spans merged (the profiler can annotate one range on two streams)."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def timeline(events: Iterable[Any]) -> dict[str, Any]:
    """Per phase window (union of the GPU-side annotations `muonbench/<phase>`; torch.profiler may record one per
    stream the range touched): busy (union of kernel intervals)
    and idle seconds, idle time per gap class (< 10 us, < 100 us, < 1 ms, >= 1 ms), the `TOP_GAPS` largest gaps with
    their neighbouring kernels, and the phase's top kernels. Empty where events carry no times (CPU-only runs)."""
    windows: dict[str, list[tuple[float, float]]] = {}
    ks: list[tuple[float, float, str]] = []
    for ev in events:
        span = _span(ev)
        if span is None or not _on_device(ev):
            continue
        name = str(ev.name)
        if name.startswith(PREFIX):
            windows.setdefault(name[len(PREFIX) :], []).append(span)
        else:
            ks.append((span[0], span[1], name))
    ks.sort()
    out: dict[str, Any] = {}
    for ph, raw in windows.items():
        spans = _union(raw)
        busy = idle = 0.0
        classes = [0.0] * (len(GAP_CLASSES_US) + 1)
        gaps: list[tuple[float, str, str]] = []
        per_kernel: dict[str, list[float]] = {}
        for w0, w1 in spans:
            inside = [k for k in ks if w0 <= k[0] < w1]
            cur_end, prev = w0, "<phase start>"
            for k0, k1, name in inside:
                per_kernel.setdefault(name, []).append(k1 - k0)
                if k0 > cur_end:
                    g = k0 - cur_end
                    idle += g
                    classes[sum(g >= c for c in GAP_CLASSES_US)] += g
                    gaps.append((g, prev, name))
                if k1 > cur_end:
                    busy += k1 - max(k0, cur_end)
                    cur_end, prev = k1, name
            if w1 > cur_end:
                g = w1 - cur_end
                idle += g
                classes[sum(g >= c for c in GAP_CLASSES_US)] += g
                gaps.append((g, prev, "<phase end>"))
        gaps.sort(key=lambda g: -g[0])
        labels = ["lt_10us", "lt_100us", "lt_1ms", "ge_1ms"]
        out[ph] = {
            "window_s": sum(b - a for a, b in spans) / 1e6,
            "busy_s": busy / 1e6,
            "idle_s": idle / 1e6,
            "idle_by_gap_s": {lab: v / 1e6 for lab, v in zip(labels, classes, strict=True)},
            "gaps": len(gaps),
            "largest_gaps": [
                {"us": round(g, 1), "after": a[:120], "before": b[:120]} for g, a, b in gaps[:TOP_GAPS]
            ],
            "top_kernels": _top(per_kernel, 25),
        }
    return out


def write(run_dir: str | Path, step: int, summary: dict[str, Any]) -> Path:
    """`<run_dir>/profile_step<step>.json` (atomic)."""
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
    for ph, t in sorted(summary.get("timeline", {}).items()):
        rows.append(
            f"{ph:>8}: GPU window {t['window_s']:.3f} s, busy {t['busy_s']:.3f} s, idle {t['idle_s']:.3f} s "
            f"({', '.join(f'{k} {v:.3f}' for k, v in t['idle_by_gap_s'].items())})"
        )
    return "\n".join(rows) + "\n" + json.dumps(summary["top_kernels"][:5])
