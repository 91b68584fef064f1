"""The `megatron` engine: a Megatron-core GPT MoE model trained with Megatron's own schedules, on GPUs.

setup: process groups (`parallel_state.initialize_model_parallel` with TP/PP/CP/EP/ETP of `cfg.parallelism`), CUDA
RNG (`model_parallel_cuda_manual_seed`, needed before building), model (megatron_model.py: TE specs when TE imports,
else local specs with SDPA core attention), `Float16Module` (bf16) and Megatron DDP (fp32 grad buffers), the
optimizer (megatron_optim.py), and the data (megatron_data.py). step: Megatron's `forward_backward_func` over
gbs / (mbs x dp) micro-batches (gradient accumulation in the DDP buffers, grads finalised by `finalize_model_grads`),
then `optimizer.step()`; CUDA events time forward-backward, the optimizer step and the Newton-Schulz calls inside it.

GPU only: `setup` raises ValueError on a machine without CUDA. torch / megatron are imported inside methods.
"""

from __future__ import annotations

import gc
import os
import random
from typing import Any, ClassVar

from bench import probes
from bench.engines.base import Engine, RankInfo, StepMetrics, count_skipped_updates
from bench.timing import PhaseTimer, phase_range
from muonbench.schema import RootConfig
from optim import registry


def _init_distributed(rank: RankInfo, backend: str) -> bool:
    """Start a process group when the launcher did not (a plain one-process run); True when we started it."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
    dist.init_process_group(backend=backend, rank=rank.rank, world_size=rank.world_size)
    return True


class MegatronEngine(Engine):
    """Megatron-core training step (see the module docstring)."""

    name: ClassVar[str] = "megatron"
    requires_gpu: ClassVar[bool] = True
    timer: ClassVar[str] = "cuda_events"

    def __init__(self) -> None:
        self.device: Any = None
        self._facts: dict[str, Any] = {}
        self._owns_pg = False
        self._gc_disabled = False
        self._overlap: Any = None
        self.probes: list[Any] = []

    # ------------------------------------------------------------------------------------------------ setup
    def setup(self, cfg: RootConfig, rank: RankInfo) -> None:
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                "engine.name='megatron' runs on NVIDIA GPUs only (Megatron-core models need CUDA); this machine "
                "has none. Use engine=hf for CPU runs."
            )
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        from bench.engines import megatron_model as mm
        from bench.engines import megatron_optim

        self.cfg = cfg
        par, model = cfg.parallelism, cfg.model
        torch.cuda.set_device(rank.local_rank)
        self.device = torch.device("cuda", rank.local_rank)
        self._owns_pg = _init_distributed(rank, "nccl")
        ps.initialize_model_parallel(
            tensor_model_parallel_size=par.tp,
            pipeline_model_parallel_size=par.pp,
            virtual_pipeline_model_parallel_size=par.vp if par.vp > 1 else None,
            context_parallel_size=par.cp,
            expert_model_parallel_size=par.ep,
            expert_tensor_parallel_size=par.etp,
        )
        # As Megatron's training `_set_random_seed`: the host RNGs too. Some weights (the MoE router's) are
        # initialised from the CPU generator; without this, two engines built in one process start differently.
        random.seed(cfg.bench.seed)
        torch.manual_seed(cfg.bench.seed)
        model_parallel_cuda_manual_seed(cfg.bench.seed)
        # MUONBENCH_MEGATRON_EXPERTS=sequential keeps Megatron's SequentialMLP (a fallback where torch lacks
        # grouped_mm); the choice is recorded in describe()["experts"].
        grouped = os.environ.get("MUONBENCH_MEGATRON_EXPERTS", "grouped_mm") != "sequential"
        mm.check_fusions(cfg.engine)
        opts = mm.build_options(cfg, use_te=mm.use_te(cfg.engine.layers), grouped_mm_experts=grouped)
        self.tconfig = mm.transformer_config(model, par, opts)
        self.model_chunks = self._build_model(mm, opts)
        self.ptimer = PhaseTimer(cuda=True)
        built = megatron_optim.build(cfg, self.model_chunks, self.ptimer)
        self._built = built
        self.optimizer = built.optimizer
        self._wire_schedule_hooks()
        self.num_microbatches = par.grad_accum
        self._overlap = self._install_ns_overlap(built)
        self.data = self._data_iterator(ps)
        self._facts = {
            "transformer_engine": opts.use_te,
            "core_attention": "te" if opts.use_te else "sdpa",
            "experts": "te_grouped_gemm"
            if opts.use_te
            else "grouped_mm"
            if opts.grouped_mm_experts
            else "sequential",
            "optimizer_kind": built.kind,
            "num_microbatches": self.num_microbatches,
            "num_params": sum(p.numel() for c in self.model_chunks for p in c.parameters()),
            "num_matrix_params": sum(1 for r in built.routes if r.optimizer == "matrix"),
            "routes": _route_summary(built.routes),
            "ns_backend": _ns_backend(built.kind),
            "ns_overlap": self._overlap.describe() if self._overlap is not None else None,
        }

        self.probes = probes.load(cfg.bench.probes)
        for probe in self.probes:
            probe.setup(self)
        torch.cuda.reset_peak_memory_stats()
        if cfg.engine.manual_gc:
            gc.collect()
            gc.freeze()  # the model's and optimizer's objects leave the collector's view
            gc.disable()
            self._gc_disabled = True

    def _build_model(self, mm: Any, opts: Any) -> list[Any]:
        import torch
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel
        from megatron.core.transformer.module import Float16Module

        spec = mm.decoder_block_spec(self.tconfig, opts)
        module = mm.build_gpt_model(
            self.cfg.model,
            self.tconfig,
            spec,
            pre_process=ps.is_pipeline_first_stage(),
            post_process=ps.is_pipeline_last_stage(),
        )
        module.cuda(torch.cuda.current_device())
        if self.tconfig.bf16:
            module = Float16Module(self.tconfig, module)
        ddp_cfg = ddp_config(self.cfg)
        return [DistributedDataParallel(config=self.tconfig, ddp_config=ddp_cfg, module=module)]

    def _install_ns_overlap(self, built: Any) -> Any:
        """`optimizer.ns_overlap`: our NS started in the last micro-batch's backward (optim.megatron.overlap)."""
        if not getattr(self.cfg.optimizer, "ns_overlap", False):
            return None
        if built.kind != "ours":
            raise ValueError(
                f"optimizer.ns_overlap=True: implementation=ours only (got {self.cfg.optimizer.implementation!r})"
            )
        from optim import megatron as om

        return om.install_ns_overlap(self.optimizer, self.model_chunks, self.num_microbatches, self.tconfig)

    def _wire_schedule_hooks(self) -> None:
        from megatron.core.distributed import finalize_model_grads

        c = self.tconfig
        c.grad_scale_func = self.optimizer.scale_loss
        c.finalize_model_grads_func = finalize_model_grads
        if self.cfg.parallelism.dp > 1:
            c.no_sync_func = self.model_chunks[0].no_sync

    def _data_iterator(self, ps: Any) -> Any:
        from bench.engines import megatron_data as md

        kind, arg = md.parse_data_spec(self.cfg.bench.data)
        m, p = self.cfg.model, self.cfg.parallelism
        if kind == "mock":
            seed = self.cfg.bench.seed + ps.get_data_parallel_rank()
            return md.mock_batches(
                vocab_size=m.vocab_size, seq_length=m.seq_length, mbs=p.mbs, seed=seed, device=self.device
            )
        return md.indexed_batches(
            arg,
            seq_length=m.seq_length,
            mbs=p.mbs,
            dp_rank=ps.get_data_parallel_rank(),
            dp_size=ps.get_data_parallel_world_size(),
            device=self.device,
        )

    # ------------------------------------------------------------------------------------------------ step
    def step(self) -> StepMetrics:
        import torch

        t = self.ptimer
        t.reset()
        m, p = self.cfg.model, self.cfg.parallelism
        for probe in self.probes:
            probe.before_step()
        with t.phase("step"):
            if self._gc_disabled:
                gc.collect(1)  # the young generations only; timed as part of the step
            level = self.cfg.engine.empty_unused_memory_level
            with t.phase("fwd_bwd"), phase_range("fwd_bwd"):
                losses = self.forward_backward()
                if level >= 2:
                    torch.cuda.empty_cache()
            for probe in self.probes:
                probe.mark("fwd_bwd")
            with t.phase("optim"), phase_range("optim"):
                ok, grad_norm = self.optimizer_step()
                if level >= 1:
                    torch.cuda.empty_cache()
        for probe in self.probes:
            probe.mark("optim")
        phases = self.last_phases = t.collect()
        probed: dict[str, float] = {}
        for probe in self.probes:
            probed |= probe.after_step()
        loss = _mean_loss(losses)
        return StepMetrics(
            step_s=phases["step"],
            fwd_bwd_s=phases["fwd_bwd"],
            optim_s=phases["optim"],
            ns_s=phases.get("ns", 0.0),
            comm_s=None,
            tokens=p.gbs * m.seq_length,
            loss=loss,
            peak_mem_bytes=int(torch.cuda.max_memory_allocated()),
            ns_flops=t.counters.get("ns_flops", 0.0) + t.counters.get("ns_overlap_flops", 0.0),
            extra={
                "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
                "update_ok": float(bool(ok)),
                "lr": float(self.optimizer.param_groups[0]["lr"]),
                "mem_end_bytes": float(torch.cuda.memory_allocated()),
                # cudaMalloc retries of the caching allocator so far (a full-memory step that frees and re-maps
                # blocks runs slower; compare with the other optimizer's run)
                "alloc_retries": float(torch.cuda.memory_stats().get("num_alloc_retries", 0)),
                **self._overlap_metrics(phases),
                **probed,
            },
        )

    def _overlap_metrics(self, phases: dict[str, float]) -> dict[str, float]:
        """With `optimizer.ns_overlap`: GPU time of the speculative NS on its side stream (inside fwd_bwd,
        overlapped; `ns_s` is the NS left in the optimizer step) and the matrices whose result the step used /
        threw away (clipped or changed gradients)."""
        if self._overlap is None:
            return {}
        stats = self._overlap.optimizer.spec_stats
        return {
            "ns_overlap_s": phases.get("ns_overlap", 0.0),
            "spec_used": float(stats["used"]),
            "spec_discarded": float(stats["discarded"]),
        }

    def forward_backward(self) -> list[dict[str, Any]]:
        """Zero the grad buffers, run Megatron's schedule over this step's micro-batches; grads end in
        each parameter's `main_grad`. Returns Megatron's per-micro-batch loss dicts."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        m, p = self.cfg.model, self.cfg.parallelism
        for chunk in self.model_chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        if self._overlap is not None:
            self._overlap.begin()
        step_func = _forward_step
        for probe in self.probes:
            step_func = probe.wrap_forward_step(step_func)
        if self._overlap is not None:
            step_func = _arm_before_last(step_func, self._overlap.arm, self.num_microbatches)
        out = list(
            get_forward_backward_func()(
                forward_step_func=step_func,
                data_iterator=self.data,
                model=self.model_chunks,
                num_microbatches=self.num_microbatches,
                seq_length=m.seq_length,
                micro_batch_size=p.mbs,
                forward_only=False,
            )
        )
        return out

    def optimizer_step(self) -> tuple[bool, Any]:
        """`optimizer.step()` on the grads now in `main_grad`: (update applied, grad norm)."""
        ok, grad_norm, _ = self.optimizer.step()
        return bool(ok), grad_norm

    def main_grads(self) -> dict[str, Any]:
        """Name -> a copy of each parameter's accumulated gradient (`main_grad`: fp32, or the parameters' dtype
        with `engine.grad_reduce_in_fp32=false`) of the first chunk."""
        return {n: p.main_grad.detach().clone() for n, p in self.model_chunks[0].named_parameters()}

    def set_main_grads(self, grads: dict[str, Any]) -> None:
        """Overwrite every parameter's `main_grad` of the first chunk (names must match `main_grads()`)."""
        import torch

        params = dict(self.model_chunks[0].named_parameters())
        if params.keys() != grads.keys():
            missing, extra = sorted(params.keys() - grads.keys()), sorted(grads.keys() - params.keys())
            raise ValueError(f"set_main_grads: names differ (missing {missing[:5]}, unknown {extra[:5]})")
        with torch.no_grad():
            for n, p in params.items():
                p.main_grad.copy_(grads[n])

    def skipped_updates(self) -> int | None:
        from optim.megatron.builders import _inner_torch_optimizers

        return count_skipped_updates(_inner_torch_optimizers(self.optimizer))

    def describe(self) -> dict[str, Any]:
        """Engine facts for run.json; `tp_modes` (parameter -> TP NS mode of our optimizer) is complete once the
        first step has resolved any `tp_mode=auto` choices."""
        facts = dict(self._facts)
        if hasattr(self, "_built"):
            facts["tp_modes"] = self._built.tp_modes()
        return facts

    def teardown(self) -> None:
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        for name in ("optimizer", "model_chunks", "data", "_built"):
            if hasattr(self, name):
                delattr(self, name)
        if self._overlap is not None:
            self._overlap.remove()
            self._overlap = None
        for probe in self.probes:
            probe.teardown()
        self.probes = []
        if self._gc_disabled:
            gc.enable()
            gc.unfreeze()
            self._gc_disabled = False
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        if self._owns_pg and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_pg = False


def ddp_config(cfg: RootConfig) -> Any:
    """Megatron's `DistributedDataParallelConfig` of the engine's model for `cfg` (builds nothing)."""
    from bench.engines import megatron_optim
    from optim import megatron as om

    return om.ddp_config(
        kind=megatron_optim.implementation(cfg),
        distributed=True,
        # ours with layer-wise ownership reduce-scatters gradients itself: DDP must not start its all-reduce
        overlap_grad_reduce=cfg.parallelism.dp > 1 and not _ours_layerwise(cfg),
        grad_reduce_in_fp32=cfg.engine.grad_reduce_in_fp32,
    )


def _ours_layerwise(cfg: RootConfig) -> bool:
    return (
        registry.spec(cfg.optimizer.name).matrix
        and cfg.optimizer.implementation == "ours"
        and (cfg.parallelism.distribution.distributed == "layerwise")
    )


def _arm_before_last(fn: Any, arm: Any, num_microbatches: int) -> Any:
    """`fn` (Megatron's forward-step function) calling `arm()` before the last micro-batch's forward."""
    calls = 0

    def step(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == num_microbatches:
            arm()
        return fn(*args, **kwargs)

    return step


def _forward_step(data_iterator: Any, model: Any) -> tuple[Any, Any]:
    """Megatron forward_step_func: per-token losses of one micro-batch and the loss reduction."""
    from functools import partial

    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, partial(_loss_func, batch["loss_mask"])


def _loss_func(loss_mask: Any, output: Any) -> tuple[Any, Any, dict[str, Any]]:
    """Sum of masked per-token losses, token count, and the [sum, count] pair Megatron averages over the batch."""
    import torch

    losses = output.float().view(-1)
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().to(torch.int)
    report = torch.stack([loss.detach().clone(), num_tokens.float()])
    return loss, num_tokens, {"lm loss": report}


def _mean_loss(losses: list[dict[str, Any]]) -> float:
    if not losses:
        return float("nan")  # not the last pipeline stage
    import torch

    total = torch.stack([d["lm loss"] for d in losses]).sum(0)
    return float(total[0] / total[1])


def _ns_backend(kind: str) -> str:
    """Which Newton-Schulz code ran: optim.kernels (plan-cached), optim.functional (torch), or EO (Megatron)."""
    if kind == "adamw":
        return "none"
    if kind == "megatron":
        return "emerging_optimizers.newton_schulz_tp"
    from optim.optimizers.muon import kernels_available

    return "optim.kernels" if kernels_available() else "optim.functional.newton_schulz"


def _route_summary(routes: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in routes:
        key = f"{r.optimizer}:{r.role}"
        out[key] = out.get(key, 0) + 1
    return out
