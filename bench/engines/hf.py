"""The `hf` engine: transformers' Qwen3-MoE / DeepSeek-V3 model, pure data parallel, on CPU (gloo) or GPUs (nccl).

One step = `grad_accum` micro-batches of forward + backward, then one all-reduce of all gradients (a separate,
timed phase: not overlapped with backward, so communication time is measurable), then the optimizer phase
(gradient clipping, `optimizer.step()`, LR schedule). Newton-Schulz is timed by wrapping the matrix optimizer's
orthogonalize call; the AdamW side by wrapping its `step`. Every rank keeps the whole optimizer (replicated):
each rank orthogonalizes every matrix, so NS FLOPs per GPU are the model's full NS FLOPs.

Precision: fp32 weights; on CUDA the forward runs under bf16 autocast (precision=bf16), on CPU in fp32.
Data: `mock` (uniform random tokens from a seeded generator, a different stream per rank) or `text:<path>`
(bytes of a file as token ids, random windows; needs vocab_size >= 256).
"""

from __future__ import annotations

import math
import resource
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.engines.base import Engine, RankInfo, StepMetrics, count_skipped_updates
from bench.flops import padded_vocab_size
from bench.models.hf_build import build_model
from bench.timing import PhaseTimer, ns_flops_plain
from muonbench.compose import check_runnable
from muonbench.schema import MatrixOptimizerSchema, RootConfig, layerwise_fields, optim_configs


def _matrix_names(routes: Any) -> Any:
    """(name, tensor) -> True for the parameters the matrix optimizer takes whole."""
    matrix = {r.name for r in routes if r.optimizer == "matrix"}
    return lambda name, p: name in matrix


class TokenStream:
    """Micro-batches of token ids (mbs, seq) from random tokens or a byte-level text file, seeded per rank."""

    def __init__(self, spec: str, *, vocab_size: int, seq_length: int, mbs: int, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.vocab_size, self.seq_length, self.mbs = vocab_size, seq_length, mbs
        self.text: torch.Tensor | None = None
        if spec == "mock":
            return
        if spec.startswith("text:"):
            path = Path(spec.removeprefix("text:"))
            if vocab_size < 256:
                raise ValueError(
                    f"bench.data={spec!r}: byte-level text needs model.vocab_size >= 256, got {vocab_size}"
                )
            data = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8).long()
            if data.numel() <= seq_length:
                raise ValueError(
                    f"bench.data={spec!r}: file has {data.numel()} bytes, needs > seq_length={seq_length}"
                )
            self.text = data
            return
        raise ValueError(f"bench.data={spec!r}: the hf engine reads 'mock' or 'text:<path>'")

    def next(self) -> torch.Tensor:
        if self.text is None:
            return torch.randint(0, self.vocab_size, (self.mbs, self.seq_length), generator=self.gen)
        starts = torch.randint(0, self.text.numel() - self.seq_length, (self.mbs,), generator=self.gen)
        return torch.stack([self.text[s : s + self.seq_length] for s in starts.tolist()])


def lr_lambda(opt: Any, total_steps: int):
    """Linear warm-up to `lr` over `lr_warmup_steps`, then `lr_decay` to `min_lr` at `total_steps` (multiplier)."""
    warm, floor = opt.lr_warmup_steps, opt.min_lr / opt.lr if opt.lr else 0.0
    decay_steps = max(1, total_steps - warm)

    def mult(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        frac = min(1.0, (step - warm) / decay_steps)
        match opt.lr_decay:
            case "constant":
                return 1.0
            case "linear":
                return 1.0 - (1.0 - floor) * frac
            case _:
                return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * frac))

    return mult


class HFEngine(Engine):
    """transformers model + our optimizers, data parallel by one gradient all-reduce per step."""

    name = "hf"

    def __init__(self) -> None:
        self.cuda = False
        self.layerwise: Any = None

    def setup(self, cfg: RootConfig, rank: RankInfo) -> None:
        par, eng = cfg.parallelism, cfg.engine
        for knob in ("tp", "pp", "cp", "ep", "etp"):
            if getattr(par, knob) != 1:
                raise ValueError(
                    f"parallelism.{knob}={getattr(par, knob)}: the hf engine is pure data parallel "
                    "(allowed: 1); use engine=megatron for model parallelism"
                )
        if cfg.precision.name != "bf16":
            raise ValueError(
                f"precision.name={cfg.precision.name!r}: the hf engine has no FP8 path; allowed: ['bf16']"
            )
        if rank.world_size != par.world_size:
            raise ValueError(
                f"parallelism.world_size={par.world_size} but {rank.world_size} processes were started"
            )
        self.rank, self.cfg = rank, cfg
        if eng.device == "cuda":
            if not torch.cuda.is_available():
                raise ValueError("engine.device=cuda but this machine has no CUDA GPU; use engine.device=cpu")
            torch.cuda.set_device(rank.local_rank)
            self.device = f"cuda:{rank.local_rank}"
            self.timer = "cuda_events"
        else:
            self.device = "cpu"
        self.cuda = eng.device == "cuda"
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16) if self.cuda else nullcontext()
        self.model = build_model(cfg.model, seed=cfg.bench.seed).to(self.device)
        self.grad_accum = par.grad_accum
        self.tokens_per_step = par.gbs * cfg.model.seq_length
        self.data = TokenStream(
            cfg.bench.data,
            vocab_size=cfg.model.vocab_size,
            seq_length=cfg.model.seq_length,
            mbs=par.mbs,
            seed=cfg.bench.seed + 1 + rank.rank,
        )
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.phases = PhaseTimer(cuda=self.cuda)
        self._build_optimizer()
        self._instrument()

    def _build_optimizer(self) -> None:
        """Replicated optimizer (one all-reduce per step), or the layer-wise distributed one when configured."""
        from optim.hybrid import build_optimizer
        from optim.routing import SplitLayout, route_parameters

        check_runnable(self.cfg)
        opt, dist_cfg, world = self.cfg.optimizer, self.cfg.parallelism.distribution, self.rank.world_size
        algo, routing, adamw = optim_configs(opt)
        layout = SplitLayout.from_hf_config(self.model.config)
        named = list(self.model.named_parameters())

        def build(params: Any) -> Any:
            return build_optimizer(
                params, algo, naming="hf", routing=routing, layout=layout, adamw=adamw, model=self.model
            )

        distributed = dist_cfg.distributed if isinstance(opt, MatrixOptimizerSchema) else "none"
        if distributed == "none" or world == 1:
            self.inner = build(named)
            self.distribution = "replicated: every rank steps every parameter after one gradient all-reduce"
        else:
            from optim.distributed.layerwise import LayerWiseDistributedOptimizer

            self.layerwise = LayerWiseDistributedOptimizer(
                named,
                build,
                is_matrix=_matrix_names(
                    route_parameters(named, naming="hf", routing=routing, layout=layout, model=self.model)
                ),
                dp_group=dist.group.WORLD,
                config=layerwise_config(self.cfg),
            )
            if dist_cfg.overlap_param_gather:
                self.layerwise.register_forward_hooks(self.model)
            self.inner = self.layerwise.inner
            self.distribution = (
                f"layerwise: whole matrices per rank ({dist_cfg.assignment}), grad {dist_cfg.grad_sync}, "
                f"param all-gather{' overlapped with forward' if dist_cfg.overlap_param_gather else ''}"
            )
            self.layerwise.instrument(self.phases.wrap)
        self.scheduler = (
            None
            if self.inner is None
            else torch.optim.lr_scheduler.LambdaLR(self.inner, lr_lambda(opt, self.cfg.bench.steps))
        )

    def _instrument(self) -> None:
        """Time the matrix optimizer's orthogonalize calls (NS FLOPs from their shapes) and the AdamW step."""
        from optim import registry

        self.ns_timed = False
        if self.inner is None:
            return
        subs = self.inner.optimizers
        matrix = subs.get("matrix")
        entry = None if matrix is None else registry.spec_of(matrix.config)
        if entry is not None and entry.tensor_parallel:  # an orthogonalizing optimizer: its calls are timed
            k = entry.ns_steps(matrix.config)  # 0: exact polar factor (SVD), timed without NS FLOPs

            def count(x: torch.Tensor) -> float:
                return ns_flops_plain(x.shape[-2], x.shape[-1], k, batch=x.shape[0])  # x: (B, m, n)

            counter = count if k > 0 else None  # exact SVD: timed under "ns", no NS FLOPs counted
            matrix.instrument(lambda fn, phase: self.phases.wrap(fn, phase, count=counter))
            self.ns_timed = True
        if "adamw" in subs:
            subs["adamw"].step = self.phases.wrap(subs["adamw"].step, "adamw")

    def _allreduce_grads(self) -> None:
        """Average gradients over ranks: one flat buffer, one all-reduce (missing grads count as zeros)."""
        grads = []
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat.div_(self.rank.world_size)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def step(self) -> StepMetrics:
        t = self.phases
        t.reset()
        cpu0 = time.process_time()
        (self.layerwise or self.inner).zero_grad(set_to_none=True)
        losses = []
        grad_norm = None
        lr = None if self.inner is None else float(self.inner.param_groups[0]["lr"])  # this step's (pre-scheduler)
        with t.phase("step"):
            with t.phase("fwd_bwd"):
                for _ in range(self.grad_accum):
                    x = self.data.next().to(self.device, non_blocking=True)
                    with self.autocast:
                        out = self.model(input_ids=x, labels=x)
                    (out.loss / self.grad_accum).backward()
                    losses.append(out.loss.detach())
            if self.rank.world_size > 1 and self.layerwise is None:
                with t.phase("comm"):
                    self._allreduce_grads()
            with t.phase("optim"):
                if self.layerwise is not None:
                    self.layerwise.step()  # grad sync, clipping, owned-piece step, parameter all-gather
                else:
                    if self.cfg.optimizer.clip_grad > 0:
                        with t.phase("clip"):
                            grad_norm = torch.nn.utils.clip_grad_norm_(
                                self.params, self.cfg.optimizer.clip_grad
                            )
                    self.inner.step()
                if self.scheduler is not None:
                    self.scheduler.step()
        s = t.collect()
        loss = float(torch.stack(losses).float().mean())
        if self.layerwise is not None:
            grad_norm = self.layerwise.grad_norm
        elif grad_norm is None:  # no clipping: the norm of the synced gradients, outside the timed step
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return StepMetrics(
            step_s=s["step"],
            fwd_bwd_s=s["fwd_bwd"] - s.get("fwd_bwd/comm", 0.0),
            optim_s=s["optim"] - s.get("optim/comm", 0.0),
            ns_s=s.get("ns", 0.0) if self.ns_timed else None,
            comm_s=s.get("comm", 0.0),
            tokens=self.tokens_per_step,
            loss=loss,
            peak_mem_bytes=int(peak),
            ns_flops=float(t.counters.get("ns_flops", 0.0)),
            extra={
                "cpu_s": time.process_time() - cpu0,
                "adamw_s": s.get("adamw", 0.0),
                "clip_s": s.get("clip", 0.0),
            }
            | ({} if grad_norm is None else {"grad_norm": float(grad_norm)})
            | ({} if lr is None else {"lr": lr}),
        )

    def skipped_updates(self) -> int | None:
        return None if self.inner is None else count_skipped_updates([self.inner])

    def describe(self) -> dict[str, Any]:
        return {
            "engine": "hf",
            "model_class": type(self.model).__name__,
            "num_params": sum(p.numel() for p in self.params),
            "vocab_padded": padded_vocab_size(
                self.cfg.model.vocab_size, self.cfg.model.make_vocab_size_divisible_by
            ),
            "routes": self.inner.summary() if self.inner is not None else {},
            "math_dtype": "bf16 autocast, fp32 weights" if self.cuda else "fp32 (CPU)",
            "optimizer_distribution": self.distribution,
            "phases": "fwd_bwd and optim exclude the communication inside them; comm_s = all communication calls",
            "ns_timing": "wrapped matrix optimizer _orthogonalize" if self.ns_timed else "none",
            "grad_accum": self.grad_accum,
            "data": self.cfg.bench.data,
            "threads": torch.get_num_threads(),
        }

    def teardown(self) -> None:
        if self.layerwise is not None:
            self.layerwise.remove_hooks()
        for name in ("layerwise", "inner", "scheduler", "model", "data"):
            self.__dict__.pop(name, None)
        if self.cuda:
            torch.cuda.empty_cache()


def layerwise_config(cfg: RootConfig) -> Any:
    """The layer-wise optimizer's config: every `parallelism.distribution` field it has
    (`muonbench.schema.layerwise_fields`) and the optimizer's clipping."""
    from optim.distributed.layerwise import LayerWiseConfig

    return LayerWiseConfig(
        **layerwise_fields(cfg.parallelism.distribution), max_grad_norm=cfg.optimizer.clip_grad
    )
