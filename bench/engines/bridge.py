"""The `bridge` engine: a recipe run by Megatron-Bridge's own `pretrain` loop, measured through its callbacks.

Bridge owns the training loop, the bench worker owns the step loop; they meet in lock-step. `setup` builds the
ConfigContainer (`recipes.bridge.build_config_container`) and starts `pretrain` on a training thread, with a
`Callback` (Bridge's structured channel, `megatron.bridge.training.callbacks`) that
- times each iteration between `on_train_step_start` and `on_train_step_end` (CUDA-synchronised wall clock) and
  the optimizer step inside it (by wrapping `optimizer.step`, synchronised before and after), and reads the loss
  and grad norm Bridge passes to `on_train_step_end`;
- hands one `StepMetrics` back through a queue and parks (at `on_train_start` and at the end of every
  `on_train_step_end`) until the worker's next `step()` releases it.
While the training thread is parked the worker thread may use the process group (metric reduction): Bridge's own
collectives between iterations (logging, exit checks) run only after the release, outside the timed window.
No log text is parsed.

`fwd_bwd_s` is the iteration minus the optimizer step: forward, backward, pipeline bubbles and gradient sync.
`ns_s` and `comm_s` are None: Megatron's optimizers do not expose them.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from bench.engines.base import Engine, RankInfo, StepMetrics
from config.schema import RootConfig

_POLL_S = 5.0


class _Stop(Exception):
    """Raised inside Bridge's loop when the bench ends the run early (the worker failed)."""


class _Lockstep:
    """Hand-over between the worker thread (`step`) and Bridge's training thread (the callback)."""

    def __init__(self) -> None:
        self.go = threading.Semaphore(0)
        self.stop = threading.Event()
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()

    def park(self) -> None:
        """Training thread: wait for the worker's next `step()` (or `teardown`)."""
        self.go.acquire()
        if self.stop.is_set():
            raise _Stop("the bench worker ended the run")

    def wait(self, thread: threading.Thread, timeout_s: float) -> tuple[str, Any]:
        """Next event from the training thread; raises when the thread died silently or time ran out."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.events.get(timeout=_POLL_S)
            except queue.Empty:
                if not thread.is_alive():
                    raise RuntimeError("Megatron-Bridge's training thread ended without reporting") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no step from Megatron-Bridge within {timeout_s:.0f} s") from None


def _make_callback(lock: _Lockstep, device: Any) -> Any:
    """A `megatron.bridge.training.callbacks.Callback` feeding `lock` (built lazily: Bridge imports TE)."""
    import torch
    from megatron.bridge.training.callbacks import Callback

    class StepChannel(Callback):
        def __init__(self) -> None:
            self.t0 = 0.0
            self.opt_s = 0.0

        def on_train_start(self, context: Any) -> None:
            optimizer = context.optimizer
            inner_step = optimizer.step

            def timed_step(*args: Any, **kwargs: Any) -> Any:
                torch.cuda.synchronize(device)
                t = time.perf_counter()
                out = inner_step(*args, **kwargs)
                torch.cuda.synchronize(device)
                self.opt_s = time.perf_counter() - t
                return out

            optimizer.step = timed_step
            params = sum(p.numel() for chunk in context.model for p in chunk.parameters())
            lock.events.put(("ready", {"params_on_rank": params, "optimizer": type(optimizer).__name__}))
            lock.park()

        def on_train_step_start(self, context: Any) -> None:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            self.opt_s = 0.0
            self.t0 = time.perf_counter()

        def on_train_step_end(self, context: Any) -> None:
            torch.cuda.synchronize(device)
            step_s = time.perf_counter() - self.t0
            losses = context.loss_dict or {}
            loss = losses.get("lm loss")
            lock.events.put(
                (
                    "step",
                    {
                        "step_s": step_s,
                        "optim_s": self.opt_s,
                        "loss": None if loss is None else float(loss),
                        "grad_norm": None if context.grad_norm is None else float(context.grad_norm),
                        "skipped": bool(context.skipped_iter),
                        "peak_mem_bytes": int(torch.cuda.max_memory_allocated(device)),
                    },
                )
            )
            lock.park()

    return StepChannel()


class BridgeEngine(Engine):
    """Megatron-Bridge `pretrain` of `recipes/` on GPUs (NeMo container)."""

    name = "bridge"
    timer = "perf_counter"

    def __init__(self) -> None:
        self._lock = _Lockstep()
        self._thread: threading.Thread | None = None
        self._plan: Any = None
        self._ready: dict[str, Any] = {}
        self._tokens = 0
        self._timeout_s = 1800.0
        self._world = 1
        self._steps_left = 0

    def setup(self, cfg: RootConfig, rank: RankInfo) -> None:
        from recipes.bridge import build_config_container

        container, self._plan = build_config_container(cfg)  # raises first when Bridge / TE are missing
        import torch
        from megatron.bridge.training.gpt_step import forward_step
        from megatron.bridge.training.pretrain import pretrain

        self.device = f"cuda:{rank.local_rank}"
        torch.cuda.set_device(rank.local_rank)
        self._tokens = cfg.parallelism.gbs * cfg.model.seq_length
        self._timeout_s = float(cfg.bench.timeout_s)
        self._world = rank.world_size
        self._steps_left = cfg.bench.steps  # == train.train_iters (recipes.overrides.benchmark_mode)
        callback = _make_callback(self._lock, torch.device(self.device))
        graphs = container.model.cuda_graph_impl == "transformer_engine"

        def train() -> None:
            try:
                torch.cuda.set_device(rank.local_rank)  # the current device is per thread
                if graphs:
                    torch.cuda.set_stream(torch.cuda.Stream())  # TE graph capture needs a non-default stream
                pretrain(container, forward_step, callbacks=[callback])
                self._lock.events.put(("done", None))
            except BaseException as exc:  # noqa: BLE001 - handed to the worker thread, which re-raises
                self._lock.events.put(("error", exc))

        self._start(train)

    def _start(self, train: Any) -> None:
        """Run `train` (Bridge's pretrain, posting to `self._lock`) on the training thread; wait until it is ready."""
        self._thread = threading.Thread(target=train, name="bridge-pretrain", daemon=True)
        self._thread.start()
        self._ready = self._expect("ready")

    def _expect(self, kind: str) -> dict[str, Any]:
        assert self._thread is not None, "setup() first"
        got, payload = self._lock.wait(self._thread, self._timeout_s)
        if got == "error":
            raise payload
        if got != kind:
            raise RuntimeError(f"Megatron-Bridge reported {got!r} while the bench expected {kind!r}")
        return payload

    def step(self) -> StepMetrics:
        self._lock.go.release()
        row = self._expect("step")
        self._steps_left -= 1
        loss = self._last_stage_loss(row["loss"])
        return StepMetrics(
            step_s=row["step_s"],
            fwd_bwd_s=row["step_s"] - row["optim_s"],
            optim_s=row["optim_s"],
            ns_s=None,
            comm_s=None,
            tokens=self._tokens,
            loss=loss,
            peak_mem_bytes=row["peak_mem_bytes"],
            extra={
                k: float(v)
                for k, v in (("grad_norm", row["grad_norm"]), ("skipped", row["skipped"]))
                if v is not None
            },
        )

    def _last_stage_loss(self, loss: float | None) -> float:
        """Only the last pipeline stage has the loss (already averaged over DP): give every rank that value."""
        if self._world == 1:
            return float("nan") if loss is None else loss
        import torch
        import torch.distributed as dist

        buf = torch.tensor([float("-inf") if loss is None else loss], dtype=torch.float64, device=self.device)
        dist.all_reduce(buf, op=dist.ReduceOp.MAX)
        return float(buf.item())

    def describe(self) -> dict[str, Any]:
        from recipes.fields import bridge_version

        return {
            "bridge_version": bridge_version(),
            "recipe": self._plan.metadata,
            "on_rank": self._ready,
            "overrides": self._plan.overrides,
            "timed_optimizer_step": True,
        }

    def teardown(self) -> None:
        """Let Bridge finish (after the last step) or abort (early failure), and wait for it before the worker
        destroys the process group."""
        if self._thread is not None and self._thread.is_alive():
            if self._steps_left > 0:
                self._lock.stop.set()  # early end: abort Bridge's loop at its next park
            self._lock.go.release()
            self._thread.join(timeout=300)
        self._thread = None
