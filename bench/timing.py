"""Phase timers for one training step: CUDA events on a GPU, `time.perf_counter` (wall clock) on a CPU.

`PhaseTimer` accumulates named phases (`fwd_bwd`, `comm`, `optim`, `ns`, `adamw`) within a step; a phase entered
inside another is also booked as `<outer>/<inner>` (e.g. `optim/comm`: communication inside the optimizer step), so
callers can report exclusive times. `collect()` returns seconds per phase (on CUDA it synchronises once, at the end of the step, so the timing itself does not serialise
the phases). `wrap(fn, phase)` times every call of a function under a phase and is how Newton-Schulz is timed: the
optimizer's orthogonalize calls are wrapped, and `ns_flops_plain` counts the FLOPs of each call from its shape.
`phase_range(name)` labels a phase for torch.profiler (`muonbench/<name>`), so a profile can be cut by phase.

torch is imported only inside CUDA code paths; the CPU timer is plain Python.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any


def ns_flops_plain(rows: int, cols: int, num_ns_steps: int, *, batch: int = 1) -> float:
    """FLOPs of `num_ns_steps` Newton-Schulz iterations on `batch` matrices of rows x cols (`optim.cost.ns_flops`,
    plain count k (4 m^2 n + 2 m^3) per matrix)."""
    from optim.cost import ns_flops

    return float(batch * ns_flops(rows, cols, num_ns_steps, "plain"))


class PhaseTimer:
    """Accumulates wall time per named phase for one step. `cuda=True` uses CUDA events (async, one sync)."""

    def __init__(self, *, cuda: bool = False) -> None:
        self.cuda = cuda
        self._cpu: dict[str, float] = defaultdict(float)
        self._events: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
        self._stack: list[str] = []
        self.counters: dict[str, float] = defaultdict(float)
        """Free-form per-step sums, e.g. `ns_flops`."""

    def reset(self) -> None:
        self._cpu.clear()
        self._events.clear()
        self._stack.clear()
        self.counters.clear()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the enclosed block under `name` and `<outer>/name` for every open outer phase (accumulates)."""
        keys = [name, *(f"{outer}/{name}" for outer in self._stack if outer != name)]
        self._stack.append(name)
        if self.cuda:
            import torch

            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._stack.pop()
                for key in keys:
                    self._events[key].append((start, end))
        else:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                dt = time.perf_counter() - t0
                self._stack.pop()
                for key in keys:
                    self._cpu[key] += dt

    def wrap(
        self, fn: Callable[..., Any], phase: str, count: Callable[..., float] | None = None
    ) -> Callable[..., Any]:
        """`fn` with every call timed under `phase`; `count(*args, **kwargs)` is added to `counters[phase + '_flops']`."""

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if count is not None:
                self.counters[f"{phase}_flops"] += count(*args, **kwargs)
            with self.phase(phase):
                return fn(*args, **kwargs)

        return timed

    def collect(self) -> dict[str, float]:
        """Seconds per phase for the step (synchronises the device once on CUDA)."""
        out = dict(self._cpu)
        if self._events:
            import torch

            torch.cuda.synchronize()
            for name, pairs in self._events.items():
                out[name] = out.get(name, 0.0) + sum(s.elapsed_time(e) for s, e in pairs) / 1e3
        return out


PHASE_PREFIX = "muonbench/"
"""Name prefix of the torch.profiler ranges of a step's phases."""


def phase_range(name: str) -> AbstractContextManager[Any]:
    """`record_function("muonbench/<name>")` (a no-op outside a profiler capture, cheap inside)."""
    try:
        from torch.profiler import record_function
    except ImportError:  # pragma: no cover - torch always has it
        return nullcontext()
    return record_function(PHASE_PREFIX + name)
