"""A lower bound of one rank's memory for a config, checked against the hardware before launch.

`estimate(cfg)`: the bytes one rank needs at least: weights and gradients (fp32 on the hf engine, bf16 otherwise),
the optimizer state sharded over data parallel ranks (AdamW: two fp32 moments; the matrix optimizers: one fp32
momentum), and one hidden-size activation per token and layer kept for backward. Everything else (master weights,
fp32 main gradients, attention and MLP activations, workspaces) only adds, so a config over the bound cannot fit.
`check(cfg)` compares it with `hardware.memory_gib` per GPU, or on a CPU run with this machine's memory shared by
its ranks; docs/configuration.md says how to run anyway (`bench.allow_oversize=true`).

No torch import.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from bench import flops
from muonbench.schema import RootConfig

GiB = 2**30


def param_counts(cfg: RootConfig) -> tuple[int, int]:
    """(non-expert, expert) parameters of the model: every decoder matrix, the embedding and the output layer."""
    m = cfg.model
    mats = flops.enumerate_ns_matrices(m, split_qkv=False, router_to_matrix=True)
    expert = sum(x.rows * x.cols * x.count for x in mats if x.expert)
    dense = sum(x.rows * x.cols * x.count for x in mats if not x.expert)
    vocab = flops.padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, cfg.parallelism.tp)
    dense += vocab * m.hidden_size * (1 if m.tie_embeddings else 2)
    return dense, expert


def estimate(cfg: RootConfig) -> dict[str, float]:
    """Lower bound of one rank's bytes by part (`total` their sum)."""
    p, m = cfg.parallelism, cfg.model
    dense, expert = param_counts(cfg)
    local = dense / (p.tp * p.pp) + expert / (p.ep * p.etp * p.pp)
    weight_bytes = 4 if cfg.engine.name == "hf" else 2
    state_bytes = 8 if cfg.optimizer.name == "adamw" else 4
    parts = {
        "weights": local * weight_bytes,
        "gradients": local * weight_bytes,
        "optimizer_state": local * state_bytes / p.dp,
        "activations": p.mbs * m.seq_length * m.hidden_size * 2 * m.num_layers / p.pp,
    }
    return {**parts, "total": sum(parts.values())}


def machine_memory_bytes() -> int | None:
    """This machine's memory (MemTotal of /proc/meminfo), None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def capacity(cfg: RootConfig) -> tuple[float, str] | None:
    """Bytes one rank may use and where that number comes from; None where unknown."""
    if cfg.engine.device == "cuda":
        if cfg.hardware.memory_gib <= 0:
            return None
        return cfg.hardware.memory_gib * GiB, f"hardware.memory_gib={cfg.hardware.memory_gib} per GPU"
    if cfg.launcher.name != "local":
        return None
    total = machine_memory_bytes()
    if total is None:
        return None
    world = cfg.parallelism.world_size
    return total / world, f"this machine's {total / GiB:.1f} GiB shared by {world} ranks ({os.uname().nodename})"


def check(cfg: RootConfig) -> None:
    """Refuse (ValueError naming the model and the parts) a config whose lower bound exceeds the memory; with
    `bench.allow_oversize=true`, warn instead."""
    cap = capacity(cfg)
    if cap is None:
        return
    need = estimate(cfg)
    if need["total"] <= cap[0]:
        return
    parts = ", ".join(f"{k} {v / GiB:.1f}" for k, v in need.items() if k != "total")
    msg = (
        f"model={cfg.model.name}: needs at least {need['total'] / GiB:.1f} GiB per rank ({parts} GiB), more than "
        f"{cap[0] / GiB:.1f} GiB ({cap[1]}); use more ranks or a smaller model, or bench.allow_oversize=true to "
        "launch anyway"
    )
    if cfg.bench.allow_oversize:
        warnings.warn(msg, stacklevel=2)
        return
    raise ValueError(msg)
