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
Newton-Schulz: the matrix optimizer's orthogonalize calls (ours, or Megatron's TensorParallelMuon) are wrapped as in
the megatron engine (`bench.engines.megatron_optim`): `ns_s` is their CUDA-event time and `ns_flops` the plain NS
FLOPs of the shapes this rank orthogonalised (its layer-wise share). `comm_s` is None.

Bridge's own throughput is recorded beside ours: `bridge_model_flops` is Bridge's FLOP count of one step
(`megatron.bridge.training.utils.flop_utils.num_floating_point_operations`, what its training log divides by its
interval time), and each step's `bridge_tflops_per_gpu` that count over our step time.

Before Bridge builds anything, the versions and file paths of the imported stack are recorded and checked against
the release the recipes are written for (`recipes.versions`); after it built the optimizer, its type is checked
against the one the plan asked for (a Bridge that ignores the `provide()` seam would silently train Adam).
"""

from __future__ import annotations

import os
import queue
import threading
import time
import warnings
from typing import Any

from bench.engines.base import Engine, RankInfo, StepMetrics
from bench.timing import PhaseTimer
from muonbench.schema import RootConfig

_POLL_S = 5.0
# A MoE step through Bridge launches thousands of small kernels: a busy host slows its forward-backward
# (docs/bridge_h200.md, "Crossover").
BUSY_LOAD_PER_CPU = 0.15


def busy_host_warning(load_1m: float, num_cpus: int) -> str | None:
    """The warning for a 1-minute load average above BUSY_LOAD_PER_CPU per CPU at the start of a run, else None."""
    if load_1m <= BUSY_LOAD_PER_CPU * max(num_cpus, 1):
        return None
    return (
        f"host load average {load_1m:.2f} on {num_cpus} CPUs at the start of the run (above "
        f"{BUSY_LOAD_PER_CPU} per CPU): this run's step times can be slower; compare runs started on an idle host"
    )


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


def _make_callback(lock: _Lockstep, device: Any, cfg: RootConfig, plan: Any) -> Any:
    """A `megatron.bridge.training.callbacks.Callback` feeding `lock` (built lazily: Bridge imports TE)."""
    import torch
    from megatron.bridge.training.callbacks import Callback

    class StepChannel(Callback):
        def __init__(self) -> None:
            self.t0 = 0.0
            self.cpu0 = 0.0
            self.opt_s = 0.0
            self.timer = PhaseTimer(cuda=True)
            self.bridge_flops = 0.0

        def on_train_start(self, context: Any) -> None:
            optimizer = context.optimizer
            check_optimizer(optimizer, plan.optimizer_impl, cfg.optimizer.name)
            _instrument_ns(optimizer, self.timer, plan.optimizer_impl, cfg.optimizer)
            self.bridge_flops = bridge_step_flops(context.state.cfg, cfg.parallelism.gbs)
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
            lock.events.put(
                (
                    "ready",
                    {
                        "params_on_rank": params,
                        "optimizer": type(optimizer).__name__,
                        "optimizer_parts": optimizer_parts(optimizer),
                        "bridge_model_flops": self.bridge_flops,
                    },
                )
            )
            lock.park()

        def on_train_step_start(self, context: Any) -> None:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            self.opt_s = 0.0
            self.timer.reset()
            self.t0 = time.perf_counter()
            self.cpu0 = time.thread_time()  # host time of the thread that runs Bridge's loop and launches its kernels

        def on_train_step_end(self, context: Any) -> None:
            torch.cuda.synchronize(device)
            step_s = time.perf_counter() - self.t0
            cpu_s = time.thread_time() - self.cpu0
            phases = self.timer.collect()
            groups = getattr(context.optimizer, "param_groups", None) or [{}]  # Megatron's chained optimizers have them
            lr = groups[0].get("lr")
            losses = context.loss_dict or {}
            loss = losses.get("lm loss")
            lock.events.put(
                (
                    "step",
                    {
                        "step_s": step_s,
                        "cpu_s": cpu_s,
                        "lr": None if lr is None else float(lr),
                        "optim_s": self.opt_s,
                        "ns_s": phases.get("ns"),
                        "ns_flops": float(self.timer.counters.get("ns_flops", 0.0)),
                        "bridge_flops": self.bridge_flops,
                        "loss": None if loss is None else float(loss),
                        "grad_norm": None if context.grad_norm is None else float(context.grad_norm),
                        "skipped": bool(context.skipped_iter),
                        "peak_mem_bytes": int(torch.cuda.max_memory_allocated(device)),
                        "mem_end_bytes": float(torch.cuda.memory_allocated(device)),
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
        self._stack: dict[str, Any] = {}

    def setup(self, cfg: RootConfig, rank: RankInfo) -> None:
        from recipes.bridge import make_config_container, require_bridge
        from recipes.versions import check_imported_stack

        require_bridge()  # raises first when Bridge / TE are missing
        self._stack = check_imported_stack()
        busy = busy_host_warning(os.getloadavg()[0], os.cpu_count() or 1) if rank.rank == 0 else None
        if busy:
            warnings.warn(busy, RuntimeWarning, stacklevel=2)
        # require_bridge() passed above; Bridge's own logger writes to bench.logger in the run directory
        container, self._plan = make_config_container(cfg, log_dir=self.run_dir or "")
        import torch
        from megatron.bridge.training.gpt_step import forward_step
        from megatron.bridge.training.pretrain import pretrain

        self.device = f"cuda:{rank.local_rank}"
        torch.cuda.set_device(rank.local_rank)
        self._tokens = cfg.parallelism.gbs * cfg.model.seq_length
        self._timeout_s = float(cfg.bench.timeout_s)
        self._world = rank.world_size
        self._steps_left = cfg.bench.steps  # == train.train_iters (recipes.overrides.benchmark_mode)
        callback = _make_callback(self._lock, torch.device(self.device), cfg, self._plan)
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
            ns_s=row.get("ns_s"),
            comm_s=None,
            tokens=self._tokens,
            loss=loss,
            peak_mem_bytes=row["peak_mem_bytes"],
            ns_flops=row.get("ns_flops", 0.0),
            extra={
                k: float(v)
                for k, v in (
                    ("grad_norm", row["grad_norm"]),
                    ("skipped", row["skipped"]),
                    ("cpu_s", row.get("cpu_s")),
                    ("lr", row.get("lr")),
                    ("mem_end_bytes", row.get("mem_end_bytes")),
                    ("alloc_retries", _alloc_retries()),
                    (
                        "bridge_tflops_per_gpu",
                        bridge_tflops(row.get("bridge_flops", 0.0), row["step_s"], self._world),
                    ),
                )
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
            "imported_stack": self._stack,
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


def bridge_tflops(flops: float, step_s: float, world: int) -> float | None:
    """Bridge's FLOP count of a step over our step time, per GPU (None when Bridge counted nothing)."""
    if not flops or step_s <= 0:
        return None
    return flops / step_s / world / 1e12


def bridge_step_flops(container: Any, global_batch: int) -> float:
    """Bridge's own FLOP count of one training step (`num_floating_point_operations`), 0.0 where it has none."""
    from megatron.bridge.training.utils.flop_utils import num_floating_point_operations

    try:
        return float(num_floating_point_operations(container, batch_size=global_batch))
    except (AttributeError, TypeError, ValueError):  # a model family Bridge has no formula for
        return 0.0


def optimizer_parts(optimizer: Any) -> list[str]:
    """`module.Class` of every torch optimizer inside Megatron's wrappers (what actually steps)."""
    from optim.megatron import _inner_torch_optimizers

    return sorted(
        {f"{type(o).__module__}.{type(o).__qualname__}" for o in _inner_torch_optimizers(optimizer)}
    )


def check_optimizer(optimizer: Any, impl: str, name: str) -> None:
    """Stop when the optimizer Bridge built is not the one the plan asked for.

    `ours`: some part must come from our `optim` package (Bridge called `OursOptimizerConfig.provide()`); a Bridge
    without that seam builds Megatron's optimizer from the same config and would train Adam under our name.
    `megatron`: no part may be ours, and Megatron's Muon must contain a Muon.

    Raises:
        RuntimeError: naming what was asked for and what was built.
    """
    parts = optimizer_parts(optimizer)
    ours = [p for p in parts if p.startswith("optim.")]
    if impl == "ours" and not ours:
        raise RuntimeError(
            f"optimizer={name} implementation=ours, but Megatron-Bridge built {parts}: the installed Bridge did not "
            "call OptimizerConfig.provide() (added in Megatron-Bridge 0.6); use the checked stack "
            "(Dockerfile build args MCORE_VERSION / BRIDGE_VERSION)"
        )
    if impl == "megatron" and ours:
        raise RuntimeError(f"optimizer={name} implementation=megatron, but our optimizer was built: {ours}")
    if impl == "megatron" and name.startswith("muon") and not any("Muon" in p for p in parts):
        raise RuntimeError(f"optimizer={name} implementation=megatron, but Megatron built no Muon: {parts}")


def _instrument_ns(optimizer: Any, timer: Any, impl: str, opt: Any) -> None:
    """Time and count Newton-Schulz inside the optimizer Bridge built (ours or Megatron's Muon)."""
    from bench.engines.megatron_optim import _time_megatron_muon, _time_ours

    num_ns_steps = getattr(opt, "num_ns_steps", 0)
    if not num_ns_steps:
        return
    if impl == "ours":
        _time_ours(optimizer, timer, num_ns_steps)
    elif opt.name.startswith("muon"):
        _time_megatron_muon(optimizer, timer, num_ns_steps)


def _alloc_retries() -> float | None:
    """cudaMalloc retries of the caching allocator so far (as the megatron engine records them), None off CUDA."""
    import torch

    return float(torch.cuda.memory_stats().get("num_alloc_retries", 0)) if torch.cuda.is_available() else None
