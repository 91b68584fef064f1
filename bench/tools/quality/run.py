"""Quality bench: train a Qwen3-MoE-shaped model on Python source with each optimizer and a fair LR sweep.

Protocol (written at the top of the report):
- Data: `bench.tools.quality.data` (stdlib corpus, or the installed packages' source deduplicated and held out by path
  hash; byte-level BPE trained on the training split only).
- Model: `model=<name>` from conf/model, vocab = the tokenizer's, seq = profile seq_len. On CUDA: fp32 weights,
  bf16 autocast, expert GEMMs as bf16 grouped GEMMs (`bench.models.hf_experts`); on CPU: fp32.
- Every optimizer is tuned by the same protocol (`bench.tools.quality.tuning`: the dimensions of `tune` one after
  another, the same number of grid points each; a learning rate whose best point is on a grid edge gets its grid
  extended), with the same token budget, a linear warm-up then cosine schedule to 10% of the peak, completed at
  the last step, and the same seed (initial weights and batch order). The non-matrix parameters of Muon, MOP and
  SOAP-REKLS have their own peak LR (`adamw_lr`). Validation loss on fixed held-out windows every `eval_every`
  steps and at the end. The best setting of `seed_optimizers` is rerun with further seeds (`best_lr_seeds`).
- Each optimizer's best setting = lowest final validation loss at the grid's seed. Target = AdamW's best final
  validation loss (mean over its seeds). Steps / tokens / seconds to target = first evaluation at which a run's
  validation loss <= target, interpolated linearly between the two evaluations around the crossing; ratios to
  AdamW with a 95% percentile-bootstrap interval over the seeds of both (`bench.tools.quality.summary`).
- Wall-clock = training time between evaluations (data, forward, backward, clipping, optimizer step; evaluation
  excluded), after an untimed warm-up of each optimizer in the process (`prewarm_steps`); optimizer-step time is
  measured by CUDA events on GPU (no extra synchronisation) and by the host clock on CPU.

Usage: `muonbench quality [profile=compute_optimal|compute_optimal_tiny|cpu|gpu|tiny] [optimizers=adamw,muon,...]
[steps=N] [out=DIR] [budget_s=S]` (or `python -m bench.tools.quality ...`). A rerun with the same `out` skips
finished trials (`bench.tools.quality.sweep`); `budget_s` stops a piece before a trial that would not end in time.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.models.hf_experts import use_autocast_grouped_experts
from bench.tools.quality.config import (  # noqa: F401 - re-exported: the bench's public names
    LR_GRIDS,
    PROFILES,
    VARIANTS,
    QualityConfig,
    base_optimizer,
    optimizer_overrides,
    parse_cli,
)
from bench.tools.quality.data import Batches
from bench.tools.quality.summary import crossing  # noqa: F401 - re-exported
from bench.tools.quality.tuning import Hparams, as_dict, is_adamw, point
from optim import registry


def lr_factor(step: int, cfg: QualityConfig, warmup_frac: float) -> float:
    """Linear warm-up over `warmup_frac` of the steps, then cosine to min_lr_frac, reached exactly at the last
    step: the multiplier of every parameter group's peak LR."""
    warm = max(1, int(warmup_frac * cfg.steps))
    if step < warm:
        return (step + 1) / warm
    t = (step - warm) / max(1, cfg.steps - 1 - warm)
    return cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def model_config(cfg: QualityConfig, vocab_size: int):  # -> muonbench.schema.ModelConfig
    """conf/model/<cfg.model> with the profile's width, depth, vocabulary and sequence length."""
    from muonbench.compose import CONF_DIR

    return replace(
        _composed_model(CONF_DIR, cfg.model),
        vocab_size=vocab_size,
        seq_length=cfg.seq_len,
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
    )


def build_model(cfg: QualityConfig, vocab_size: int, *, seed: int | None = None):
    """The proxy from conf/model/<cfg.model>, widened/deepened per profile, as a transformers model on cfg.device."""
    import torch

    from bench.models.hf_build import build_model as build_hf_model

    with torch.device(cfg.device):
        model = build_hf_model(model_config(cfg, vocab_size), seed=cfg.seed if seed is None else seed)
    if cfg.device == "cuda":
        use_autocast_grouped_experts(model)
    return model


def optimizer_configs(name: str, hp: Hparams, cfg: QualityConfig) -> tuple[Any, Any, Any]:
    """(algorithm config, RoutingConfig | None, AdamWConfig of the rest) of `name`'s trial at `hp`:
    conf/optimizer/<name>.yaml composed by `muonbench.load` with `optimizer_overrides`, converted by
    `muonbench.schema.optim_configs`; the matrices at `hp.lr`, the non-matrix side at `hp.adamw_lr` (AdamW: every
    parameter at `hp.lr` with beta2 `hp.beta2`)."""
    from muonbench.compose import CONF_DIR

    algorithm, routing, adamw = _composed(CONF_DIR, tuple(optimizer_overrides(name, cfg)))
    algorithm = replace(algorithm, lr=hp.lr, weight_decay=hp.weight_decay)
    if is_adamw(name):
        algorithm = replace(algorithm, betas=(algorithm.betas[0], hp.beta2))
        return algorithm, routing, algorithm
    assert hp.adamw_lr is not None, hp
    return algorithm, routing, replace(adamw, lr=hp.adamw_lr, weight_decay=hp.weight_decay)


@functools.lru_cache(maxsize=8)
def _composed_model(conf_dir: Path, name: str):  # -> muonbench.schema.ModelConfig
    """conf/model/<name> composed once per process (every trial builds its model from it)."""
    from muonbench import load

    return load([f"model={name}"]).model


@functools.lru_cache(maxsize=32)
def _composed(conf_dir: Path, overrides: tuple[str, ...]) -> tuple[Any, Any, Any]:
    """One composition per optimizer and process: every trial rebuilds its optimizer. `conf_dir` (the tree
    `muonbench.load` reads) is part of the key, so a different tree composes afresh."""
    import muonbench
    from muonbench.schema import optim_configs

    return optim_configs(muonbench.load(list(overrides)).optimizer)


def build_opt(name: str, model, hp: Hparams, cfg: QualityConfig):
    """The optimizer under test through the suite's own factory (matrices to `name`, the rest to AdamW). Each
    parameter group keeps its peak LR as `peak_lr` (the schedule scales it)."""
    import optim

    algorithm, routing, adamw = optimizer_configs(name, hp, cfg)
    opt = optim.build_optimizer(model, algorithm, naming="hf", routing=routing, adamw=adamw)
    for g in opt.param_groups:
        g["peak_lr"] = g["lr"]
    return opt


def set_lr(opt, factor: float) -> None:
    """Every group at `factor` x its own peak LR (the matrices' and the non-matrix side's differ)."""
    for g in opt.param_groups:
        g["lr"] = g["peak_lr"] * factor


def _autocast(cfg: QualityConfig):
    import contextlib

    import torch

    if cfg.device == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def evaluate(model, val, cfg: QualityConfig) -> float:
    import torch
    import torch.nn.functional as F

    model.eval()
    with torch.no_grad(), _autocast(cfg):
        losses = [
            F.cross_entropy(model(input_ids=x).logits.float().flatten(0, 1), y.reshape(-1)) for x, y in val
        ]
    model.train()
    return float(torch.stack(losses).mean())


def _train_step(model, opt, x, y, cfg: QualityConfig, events):
    """Forward, backward, clipping, optimizer step; returns the loss tensor (no host sync on CUDA)."""
    import torch
    import torch.nn.functional as F

    with _autocast(cfg):
        out = model(input_ids=x)
        loss = F.cross_entropy(out.logits.float().flatten(0, 1), y.reshape(-1))
        aux = getattr(out, "aux_loss", None)  # MoE load-balancing loss, as in training (not in val loss)
        total = loss + model.config.router_aux_loss_coef * aux if aux is not None else loss
    total.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if events:
        events[0].record()
    t1 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if events:
        events[1].record()
    return loss, time.perf_counter() - t1  # host time: the optimizer-step time on CPU only


class Interrupted(BaseException):
    """A stop signal arrived (raised by the sweep's signal handler). A BaseException, so that the sweep's
    `except Exception` never records the trial it interrupts as a failed one."""

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.step: int | None = None
        """The trial's step (1-based, as in its curve) in progress when the signal arrived; None outside a trial."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Prewarm:
    """What an optimizer's prewarm measured, by the host clock (synchronised with the GPU after each part)."""

    seconds: float
    """The whole prewarm."""
    num_steps: int
    build_s: float
    """Model, optimizer, batches and validation windows built."""
    step_s: float | None
    """Mean seconds of a training step after the first (the first compiles and allocates); None for one step."""
    eval_s: float
    """One evaluation on the validation windows."""


def refresh_period(name: str, cfg: QualityConfig) -> int:
    """Steps after which `name`'s per-step work repeats: SOAP-REKLS refreshes its eigenbases at step 1 and then
    every `precondition_frequency` steps; the others do the same work every step."""
    field = registry.spec(base_optimizer(name)).refresh_every
    return getattr(cfg, field) if field else 1


def prewarm(name: str, cfg: QualityConfig, train_tokens, val, vocab: int, *, num_steps: int) -> Prewarm:
    """`num_steps` untimed steps of `name` and one evaluation on a throwaway model (kernels compiled, plans
    measured, workspaces allocated before the trial); returns their times. Steps 2 to `num_steps` cover whole
    periods of the optimizer's work when `num_steps - 1` is a multiple of `refresh_period`."""
    import torch

    assert num_steps >= 1, num_steps
    sync = torch.cuda.synchronize if cfg.device == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    model = build_model(cfg, vocab)
    opt = build_opt(name, model, point(name, cfg, lr=1e-4), cfg)
    batches = Batches(train_tokens, batch_size=cfg.batch_size, seq_len=cfg.seq_len, seed=cfg.seed + 10_000)
    val = [(x.to(cfg.device), y.to(cfg.device)) for x, y in val]
    sync()
    build_s = time.perf_counter() - t0
    step_times = []
    for _ in range(num_steps):
        t = time.perf_counter()
        _train_step(model, opt, *batches.next(), cfg, None)
        sync()
        step_times.append(time.perf_counter() - t)
    t = time.perf_counter()
    evaluate(model, val, cfg)
    eval_s = time.perf_counter() - t
    del model, opt
    later = step_times[1:]
    return Prewarm(
        seconds=time.perf_counter() - t0,
        num_steps=num_steps,
        build_s=build_s,
        step_s=sum(later) / len(later) if later else None,
        eval_s=eval_s,
    )


def train_one(
    name: str, hp: Hparams, cfg: QualityConfig, train_tokens, val, vocab: int, log
) -> dict[str, Any]:
    """One trial: `cfg.steps` steps of `name` at `hp`; the validation curve and the timings."""
    import torch

    seed, lr = hp.seed, hp.lr
    cuda = cfg.device == "cuda"
    t_start = time.perf_counter()
    torch.manual_seed(seed)
    model = build_model(cfg, vocab, seed=seed)
    opt = build_opt(name, model, hp, cfg)
    batches = Batches(train_tokens, batch_size=cfg.batch_size, seq_len=cfg.seq_len, seed=seed)
    val = [(x.to(cfg.device), y.to(cfg.device)) for x, y in val]
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    build_s = time.perf_counter() - t_start
    curve: list[dict[str, float]] = []
    wall = opt_time = eval_s = 0.0
    status = "ok"
    seg_events: list[Any] = []
    seg_start = time.perf_counter()
    step = 0
    try:
        for step in range(cfg.steps):
            x, y = batches.next()
            set_lr(opt, lr_factor(step, cfg, hp.warmup_frac))
            events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if cuda else None
            loss, host_opt_s = _train_step(model, opt, x, y, cfg, events)
            if events:
                seg_events.append(events)
            else:
                opt_time += host_opt_s
            if (step + 1) % cfg.eval_every and step + 1 != cfg.steps:
                continue
            if cuda:
                torch.cuda.synchronize()
            wall += time.perf_counter() - seg_start
            opt_time += sum(a.elapsed_time(b) for a, b in seg_events) / 1e3
            seg_events = []
            train_loss = loss.item()
            t_eval = time.perf_counter()
            v = evaluate(model, val, cfg)
            eval_s += time.perf_counter() - t_eval
            if not (math.isfinite(train_loss) and math.isfinite(v)):
                status = "diverged"
                break
            tokens = (step + 1) * cfg.batch_size * cfg.seq_len
            curve.append(
                {"step": step + 1, "tokens": tokens, "train_loss": train_loss, "val_loss": v, "wall_s": wall}
            )
            log(
                f"  {name:<18} lr={lr:.0e} seed={seed} step {step + 1:>5}/{cfg.steps} train {train_loss:.3f} val {v:.3f}"
            )
            seg_start = time.perf_counter()
    except Interrupted as exc:
        exc.step = step + 1
        raise
    final = curve[-1]["val_loss"] if curve and status == "ok" else float("inf")
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    del model, opt
    return {
        "optimizer": name,
        "lr": lr,
        "seed": seed,
        "hparams": as_dict(hp),
        "status": status,
        "final_val_loss": final,
        "curve": curve,
        "wall_s": wall,
        "opt_step_s": opt_time,
        "steps": cfg.steps,
        "tokens_per_step": cfg.batch_size * cfg.seq_len,
        "build_s": build_s,
        "eval_s": eval_s,
        "trial_s": time.perf_counter() - t_start,
        "peak_mem_gib": peak,
    }
