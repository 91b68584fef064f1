"""One rank's memory for a config: predicted peak (GPU engines) or a lower bound (hf engine), checked before launch.

`predict(cfg)`: the peak bytes one rank of the megatron or bridge engine allocates, by part: bf16 weights, gradients
(fp32 `main_grad` on the megatron engine, Bridge's bf16 buffers), the optimizer state (fp32 master weights plus
AdamW's two moments or the matrix optimizer's one momentum, AdamW's on the embedding and output; sharded over data
parallel ranks), and three fitted terms: activations kept for backward (per token and layer, in proportion to the
layer's forward activation bytes, `perfmodel.compute.activation_bytes_per_token`), the logits and their
gradients (per token and vocabulary entry), and the matrix optimizer's transient buffers per expert parameter. Their
coefficients are fitted per engine on the committed GPU runs' measured peaks (`FIT`, written by
`bench.tools.perfmodel.memfit`, with its in-sample and leave-one-out errors).

`estimate(cfg)`: the lower bound of the hf engine (fp32 weights and gradients, the state, one hidden-size activation
per token and layer), which the model does not predict. `check(cfg)` compares the prediction (or bound) with
`hardware.memory_gib` per GPU, or on a CPU run with this machine's memory shared by its ranks; `check_gpu` with the
GPU a local run finds (its name against the hardware group, its free memory); docs/configuration.md says how to run
anyway (`bench.allow_oversize=true`).

No torch import.
"""

from __future__ import annotations

import functools
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

from bench import flops
from muonbench import engines
from muonbench.schema import RootConfig
from optim import registry

GiB = 2**30
FIT = Path(__file__).resolve().parent / "tools" / "perfmodel" / "data" / "memory_fit.json"
"""Fitted coefficients of the predicted peak per engine, with the runs and errors of the fit."""
WEIGHT_BYTES = 2.0
"""bf16 weights (megatron and bridge engines)."""
ADAMW_STATE_BYTES = 12.0
"""fp32 master weight, first and second moment."""
MATRIX_STATE_BYTES = 8.0
"""fp32 master weight and one momentum (Muon and the other matrix optimizers)."""
TERMS = ("activations", "logits", "optimizer_transient")
"""The fitted terms, in the order of `features` and of a fit's coefficients."""


def param_counts(cfg: RootConfig) -> tuple[int, int]:
    """(non-expert, expert) parameters of the model: every decoder matrix, the embedding and the output layer."""
    m = cfg.model
    mats = flops.enumerate_ns_matrices(m, split_qkv=False, router_to_matrix=True)
    expert = sum(x.rows * x.cols * x.count for x in mats if x.expert)
    dense = sum(x.rows * x.cols * x.count for x in mats if not x.expert)
    dense += vocab_params(cfg)
    return dense, expert


def vocab_params(cfg: RootConfig) -> int:
    """Embedding and output layer parameters (one table when tied)."""
    m = cfg.model
    vocab = flops.padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, cfg.parallelism.tp)
    return vocab * m.hidden_size * (1 if m.tie_embeddings else 2)


def estimate(cfg: RootConfig) -> dict[str, float]:
    """Lower bound of one rank's bytes by part (`total` their sum)."""
    p, m = cfg.parallelism, cfg.model
    dense, expert = param_counts(cfg)
    local = dense / (p.tp * p.pp) + expert / (p.ep * p.etp * p.pp)
    weight_bytes = engines.spec(cfg.engine.name).param_bytes
    state_bytes = 4 if registry.spec(cfg.optimizer.name).matrix else 8
    parts = {
        "weights": local * weight_bytes,
        "gradients": local * weight_bytes,
        "optimizer_state": local * state_bytes / p.dp,
        "activations": p.mbs * m.seq_length * m.hidden_size * 2 * m.num_layers / p.pp,
    }
    return {**parts, "total": sum(parts.values())}


def features(cfg: RootConfig) -> tuple[dict[str, float], dict[str, float]]:
    """(the exact parts in bytes: weights, gradients, optimizer_state; the fitted terms' features: TERMS) of the
    first pipeline stage's rank (it holds the most micro-batches in flight and the embedding)."""
    from bench.tools.perfmodel.compute import activation_bytes_per_token

    p, m, engine = cfg.parallelism, cfg.model, cfg.engine.name
    dense, expert = param_counts(cfg)
    vocab = vocab_params(cfg)
    local_dense = (dense - vocab) / (p.tp * p.pp) + vocab / p.tp / (1 if p.pp == 1 else 2)
    local_expert = expert / (p.ep * p.etp * p.pp)
    local = local_dense + local_expert
    if not registry.spec(cfg.optimizer.name).matrix:
        state = local * ADAMW_STATE_BYTES
    else:
        nonmatrix = vocab / p.tp / (1 if p.pp == 1 else 2)
        state = (local - nonmatrix) * MATRIX_STATE_BYTES + nonmatrix * ADAMW_STATE_BYTES
    exact = {
        "weights": local * WEIGHT_BYTES,
        "gradients": local * engines.spec(engine).grad_bytes,
        "optimizer_state": state / (p.dp * p.cp),
    }
    tokens = p.mbs * m.seq_length / p.cp
    in_flight = min(p.pp, max(1, p.gbs // (p.mbs * p.dp)))
    n_dense = m.num_dense_layers if m.num_experts else m.num_layers
    per_token = sum(
        activation_bytes_per_token(m, "dense" if i < n_dense else "moe", q8=0.0) for i in range(m.num_layers)
    )
    padded = flops.padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, p.tp)
    fitted = {
        "activations": tokens * in_flight * per_token / (p.pp * p.tp),
        "logits": tokens * padded / p.tp,
        "optimizer_transient": local_expert if registry.spec(cfg.optimizer.name).matrix else 0.0,
    }
    return exact, fitted


@functools.cache
def _fit(path: Path = FIT) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def has_fit(engine: str) -> bool:
    """Whether `FIT` holds the fitted terms of `engine` (the engines whose peak `features` models)."""
    return engine in _fit().get("engines", {})


def predict(cfg: RootConfig) -> dict[str, Any] | None:
    """Predicted peak bytes of one rank by part (`total` their sum) and `basis` (what it rests on), for an engine
    with a fit in `FIT`; None for another engine (the hf engine: `estimate` bounds it)."""
    fit = _fit().get("engines", {}).get(cfg.engine.name)
    if fit is None or cfg.engine.device != "cuda":
        return None
    exact, fitted = features(cfg)
    parts: dict[str, Any] = dict(exact)
    for term in TERMS:
        parts[term] = fitted[term] * float(fit["coefficients"][term])
    total = sum(parts.values())
    loo = fit["loo_rel_error"]
    return {
        **parts,
        "total": total,
        "basis": (
            f"fitted on {fit['num_runs']} committed {cfg.engine.name}-engine GPU runs, leave-one-out error "
            f"{100 * loo[0]:+.1f}% to {100 * loo[1]:+.1f}% (bench/memory.py)"
        ),
    }


def peak(cfg: RootConfig) -> tuple[float, str]:
    """(bytes, what the number is): the predicted peak where there is a fit, else the lower bound."""
    pred = predict(cfg)
    if pred is not None:
        return float(pred["total"]), "predicted peak"
    return estimate(cfg)["total"], "lower bound"


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


def fits(cfg: RootConfig) -> bool | None:
    """Whether the predicted peak (or bound) fits the hardware row's memory; None where that is unknown."""
    cap = capacity(cfg)
    return None if cap is None else peak(cfg)[0] <= cap[0]


def _refuse(cfg: RootConfig, need: float, what: str, cap: float, where: str) -> None:
    parts = ""
    pred = predict(cfg)
    if pred is None:
        est = estimate(cfg)
        parts = " (" + ", ".join(f"{k} {v / GiB:.1f}" for k, v in est.items() if k != "total") + " GiB)"
    verb = "needs" if pred is not None else "needs at least"
    msg = (
        f"model={cfg.model.name}: {verb} {need / GiB:.1f} GiB per rank ({what}){parts}, more than "
        f"{cap / GiB:.1f} GiB ({where}); use more ranks or a smaller model, or bench.allow_oversize=true to "
        "launch anyway"
    )
    if cfg.bench.allow_oversize:
        warnings.warn(msg, stacklevel=3)
        return
    raise ValueError(msg)


def check(cfg: RootConfig) -> None:
    """Refuse (ValueError naming the model and the numbers) a config whose predicted peak (or lower bound) exceeds
    the memory; with `bench.allow_oversize=true`, warn instead."""
    cap = capacity(cfg)
    if cap is None:
        return
    need, what = peak(cfg)
    if need > cap[0]:
        _refuse(cfg, need, what, *cap)


def matches_gpu(hardware: str, gpu_name: str) -> bool:
    """Whether a GPU's name (`NVIDIA H100 80GB HBM3`) belongs to the hardware group (`h100`)."""
    return re.search(rf"(?<![a-z0-9]){re.escape(hardware.lower())}(?![a-z0-9])", gpu_name.lower()) is not None


def check_gpu(cfg: RootConfig, gpu_name: str, free_bytes: float) -> None:
    """Compare the config with the GPU a local run finds, before the model is built: warn when its name is not of
    the hardware group (the prediction and the memory check assumed that group), refuse (or with
    `bench.allow_oversize=true` warn) when the predicted peak exceeds its free memory."""
    if not matches_gpu(cfg.hardware.name, gpu_name):
        warnings.warn(
            f"hardware={cfg.hardware.name!r} but this GPU is {gpu_name!r}: predictions and the memory check assume "
            "the hardware group; pass the group of this GPU (conf/hardware/)",
            stacklevel=2,
        )
    need, what = peak(cfg)
    if need > free_bytes:
        _refuse(cfg, need, what, free_bytes, f"free on this {gpu_name}")
