"""Per-GPU step time = forward/backward (with bubble and exposed model communication) + exposed data-parallel
communication + optimizer step, and the throughput numbers derived from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench import flops
from bench.tools.perfmodel import compute, hwprofile, nscost
from bench.tools.perfmodel import optimizer as opt
from muonbench.schema import RootConfig


@dataclass(kw_only=True, slots=True)
class Prediction:
    """One predicted configuration."""

    step_time_s: float
    tflops_per_gpu_model: float
    """Megatron model FLOPs per step / (GPUs x step time); optimizer FLOPs never included."""
    tflops_per_gpu_ns: float
    """Plain-count NS FLOPs per GPU (mean over GPUs, bench.flops.ns_load_per_gpu) / step time; 0 for AdamW."""
    breakdown: dict[str, float]
    """Seconds per term; they add up to step_time_s."""
    profile: str
    info: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tflops_per_gpu_model": self.tflops_per_gpu_model,
            "tflops_per_gpu_ns": self.tflops_per_gpu_ns,
            "step_time_s": self.step_time_s,
            "profile": self.profile,
            "breakdown": self.breakdown,
            "info": self.info,
        }


def predict(cfg: RootConfig, profile: str = "published", *, ns_as_configured: bool = False) -> Prediction:
    """Predict one step of `cfg` (model, parallelism, hardware, precision, optimizer) under an algorithm profile
    (`ns_as_configured`: NS precision and Gram-NS from the optimizer config, `optimizer.resolve`)."""
    model, par, hw, prec = cfg.model, cfg.parallelism, cfg.hardware, cfg.precision
    algo = opt.resolve(cfg.optimizer, cfg.parallelism.distribution, profile, ns_as_configured=ns_as_configured)
    pipe = compute.pipeline_time(model, par, hw, prec, cfg.engine.name)
    slowest = pipe["slowest"]
    assert isinstance(slowest, compute.StageTime)
    fb_compute = sum(slowest.terms[k] for k in ("gemm", "attention", "activation_traffic"))
    step = opt.optimizer_step(model, par, hw, prec, algo, backward_s=fb_compute * 2.0 / 3.0)
    ns_s = step.pop("ns_s")
    breakdown = {f"fwd_bwd_{k}": v for k, v in slowest.terms.items()}
    breakdown["pipeline_bubble"] = float(pipe["bubble"])  # type: ignore[arg-type]
    breakdown["pipeline_p2p"] = float(pipe["pp_p2p"])  # type: ignore[arg-type]
    breakdown.update(step)
    total = sum(breakdown.values())
    model_flops = flops.model_flops_per_step(model, par)
    ns_tf = 0.0
    if algo.optimizer == "muon":
        load = flops.ns_load_per_gpu(
            model,
            par,
            num_ns_steps=algo.num_ns_steps,
            tp_mode=algo.tp_mode,
        )
        ns_tf = load["mean"]["plain"] / total / 1e12
    info = {
        "optimizer": algo.optimizer,
        "grad_sync": algo.grad_sync if algo.optimizer == "muon" else "reduce_scatter",
        "assignment": algo.assignment,
        "ns_convention": algo.convention,
        "num_ns_steps": algo.num_ns_steps,
        "tp_mode": algo.tp_mode,
        "slowest_pp_rank": slowest.pp_rank,
        "hardware": hw.name,
        "world_size": par.world_size,
        "state_memory_gib": opt.state_memory_gib(model, par, algo),
        "ns_s": ns_s,
        "ns_precision": algo.ns_precision,
        "memory_gib": hw.memory_gib,
        "hardware_profile": hwprofile.describe(hw.name),
    }
    return Prediction(
        step_time_s=total,
        tflops_per_gpu_model=model_flops / par.world_size / total / 1e12,
        tflops_per_gpu_ns=ns_tf,
        breakdown=breakdown,
        profile=profile,
        info=info,
    )


def tp_mode_table(cfg: RootConfig, num_ns_steps: int | None = None) -> list[dict[str, Any]]:
    """`tp_mode=auto` per TP-sharded matrix kind: predicted ms of each mode and the choice."""
    par, hw = cfg.parallelism, cfg.hardware
    k = num_ns_steps or int(getattr(cfg.optimizer, "num_ns_steps", 5))
    rows: list[dict[str, Any]] = []
    for m in flops.enumerate_ns_matrices(cfg.model, split_qkv=True):
        tp = par.etp if m.expert else par.tp
        if tp <= 1 or m.tp_partition_dim < 0:
            continue
        t = nscost.tp_mode_times(m.rows, m.cols, tp, hw, partition_dim=m.tp_partition_dim, num_ns_steps=k)
        rows.append(
            {
                "kind": m.kind,
                "rows": m.rows,
                "cols": m.cols,
                "tp": tp,
                "partition_dim": m.tp_partition_dim,
                "duplicated_ms": t["duplicated"],
                "distributed_ms": t["distributed"],
                "choice": nscost.choose_tp_mode(
                    m.rows, m.cols, tp, hw, partition_dim=m.tp_partition_dim, num_ns_steps=k
                ),
            }
        )
    return rows
