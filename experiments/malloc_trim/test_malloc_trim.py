"""Probe malloc_trim: glibc's malloc_trim(0) at setup and after each warm-up step."""

from __future__ import annotations

from experiments.malloc_trim.probe import malloc_trim


def test_malloc_trim_runs_on_glibc() -> None:
    """The probe's helper: glibc's malloc_trim(0) returns 0 or 1 (this CPU machine runs glibc)."""
    import gc

    junk = [bytearray(1000) for _ in range(20000)]  # 20 MB of small blocks, then freed: something to trim
    del junk
    gc.collect()
    assert malloc_trim() in (0, 1)
