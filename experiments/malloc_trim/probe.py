"""Probe `malloc_trim`: glibc `malloc_trim(0)` at setup and after each warm-up step (outside the timed step).

Hands back and consolidates a host heap that a first-step compile (Triton / LLVM) or NS plan measurement left
fragmented, to test whether that fragmentation slows the timed steps.
"""

from __future__ import annotations

from typing import Any

from bench import probes


def malloc_trim() -> int:
    """glibc `malloc_trim(0)`: return free heap memory to the OS and consolidate the free lists (1 if memory was
    released). ValueError off glibc, where the probe has no meaning."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name or "libc.so.6").malloc_trim
    except (OSError, AttributeError) as e:
        raise ValueError(f"probe malloc_trim needs glibc's malloc_trim (libc: {name!r}): {e}") from e
    return int(fn(0))


class Probe(probes.Probe):
    def setup(self, engine: Any) -> None:
        malloc_trim()  # fails here, not after the first step, where glibc is missing
        self.warmup_steps, self.steps_done = engine.cfg.bench.warmup_steps, 0

    def after_step(self) -> dict[str, float]:
        self.steps_done += 1
        if self.steps_done <= self.warmup_steps:
            malloc_trim()
        return {}
