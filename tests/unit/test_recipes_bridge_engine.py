"""The bridge engine's lock-step hand-over with Bridge's training thread (bench/engines/bridge.py), driven by a fake
`pretrain` that calls the channel the way the real callback does (ready -> park; per step: post -> park).
Bridge itself needs GPUs and Transformer Engine; this localises bugs in the threading protocol.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from bench.engines.bridge import BridgeEngine, _Stop


def _engine(steps: int) -> BridgeEngine:
    eng = BridgeEngine()
    eng._steps_left = steps
    eng._tokens = 1000
    eng._timeout_s = 30.0
    return eng


def _fake_pretrain(eng: BridgeEngine, steps: int, log: list[str], *, fail_at: int | None = None) -> Any:
    lock = eng._lock

    def train() -> None:
        try:
            lock.events.put(("ready", {"params_on_rank": 7}))
            lock.park()
            for i in range(steps):
                if i == fail_at:
                    raise RuntimeError(f"CUDA out of memory at step {i}")
                log.append(f"step{i}")
                lock.events.put(
                    (
                        "step",
                        {
                            "step_s": 1.0 + i,
                            "optim_s": 0.25,
                            "loss": 10.0 - i,
                            "grad_norm": 2.0,
                            "skipped": False,
                            "peak_mem_bytes": 123,
                        },
                    )
                )
                lock.park()
            log.append("finished")
            lock.events.put(("done", None))
        except _Stop:
            log.append("stopped")
        except BaseException as exc:  # noqa: BLE001 - as the engine does: hand it to the worker
            lock.events.put(("error", exc))

    return train


def test_steps_in_lockstep_then_finish() -> None:
    log: list[str] = []
    eng = _engine(3)
    eng._start(_fake_pretrain(eng, 3, log))
    assert eng._ready == {"params_on_rank": 7} and log == []  # parked until the first step()
    m = eng.step()
    assert (m.step_s, m.optim_s, m.fwd_bwd_s, m.loss, m.tokens) == (1.0, 0.25, 0.75, 10.0, 1000)
    assert m.extra == {"grad_norm": 2.0, "skipped": 0.0} and log == ["step0"]
    assert [eng.step().loss for _ in range(2)] == [9.0, 8.0]
    eng.teardown()
    assert log == ["step0", "step1", "step2", "finished"]


def test_early_teardown_stops_bridge_loop() -> None:
    log: list[str] = []
    eng = _engine(3)
    eng._start(_fake_pretrain(eng, 3, log))
    eng.step()
    thread = eng._thread
    eng.teardown()
    assert log == ["step0", "stopped"] and thread is not None and not thread.is_alive()


def test_training_error_reaches_the_worker() -> None:
    eng = _engine(3)
    eng._start(_fake_pretrain(eng, 3, [], fail_at=1))
    eng.step()
    with pytest.raises(RuntimeError, match="out of memory at step 1"):
        eng.step()
    eng.teardown()


def test_silent_thread_death_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bench.engines.bridge._POLL_S", 0.05)
    eng = _engine(1)
    with pytest.raises(RuntimeError, match="ended without reporting"):
        eng._start(lambda: None)
    assert isinstance(eng._lock.go, threading.Semaphore)


def test_busy_host_warning_names_the_load_and_the_threshold():
    """Localises a Bridge comparison started on a busy host (a TE build, a compile) without a word in the log."""
    from bench.engines.bridge import BUSY_LOAD_PER_CPU, busy_host_warning

    assert busy_host_warning(1.45, 16) is None  # what the crossover runs started at
    msg = busy_host_warning(3.9, 16)
    assert msg is not None and "3.90 on 16 CPUs" in msg and str(BUSY_LOAD_PER_CPU) in msg
