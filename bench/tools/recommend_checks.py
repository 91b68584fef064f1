"""The two checks of `bench.tools.recommend` that need torch: the singular-value band a Newton-Schulz coefficient set
reaches in a number of steps (its quality, which the cost model does not see), and the recommended optimizer built
and stepped on the CPU on a tiny slice of the model.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from muonbench.schema import ModelConfig, RootConfig

BAND_SLACK = 0.01
"""Singular values within 1% of 1 count as converged (Polar Express: error < 1e-2 after its 8 steps,
docs/references.md#optimizers), so a set and step count whose band is that close is as good as any closer one."""

SLICE = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "kv_channels": 16,
    "ffn_hidden_size": 128,
    "moe_ffn_hidden_size": 32,
    "vocab_size": 512,
    "seq_length": 16,
}
"""The tiny slice's sizes (those of conf/experiment/cpu/hf_tiny_dp2.yaml; experts and MLA ranks in `slice_of`):
family, layer types, shared experts and the splits' structure are the model's own."""


@functools.cache
def _test_matrices() -> Any:
    """Three fp64 24 x 40 matrices of condition number 100 (singular values log-spaced 1 .. 1e-2), fixed seed: the
    matrices tests/unit/test_ns.py pins each set's band on."""
    import torch

    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(3):
        u, _ = torch.linalg.qr(torch.randn(24, 24, generator=gen, dtype=torch.float64))
        v, _ = torch.linalg.qr(torch.randn(40, 24, generator=gen, dtype=torch.float64))
        out.append((u * torch.logspace(0, -2, 24, dtype=torch.float64)) @ v.T)
    return torch.stack(out)


@functools.cache
def band_error(coefficient_type: str, num_ns_steps: int) -> float:
    """max |s - 1| over the singular values s of fp64 NS on `_test_matrices`: how far `num_ns_steps` iterations of
    the set leave the update from orthogonal (0 = the exact polar factor)."""
    import torch

    from optim.functional.newton_schulz import newton_schulz

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 24 x 40 matrices: threads only contend
    try:
        x = newton_schulz(
            _test_matrices(),
            num_ns_steps=num_ns_steps,
            coefficients=coefficient_type,
            compute_dtype=torch.float64,
        )
        return float((torch.linalg.svdvals(x) - 1).abs().max())
    finally:
        torch.set_num_threads(threads)


def keeps_quality(coefficient_type: str, num_ns_steps: int, *, baseline: tuple[str, int]) -> bool:
    """The set at that step count ends no farther from orthogonal than `baseline` (set, steps) does, or converged."""
    err = band_error(coefficient_type, num_ns_steps)
    return err <= max(band_error(*baseline), BAND_SLACK)


def slice_of(model: ModelConfig) -> ModelConfig:
    """`model` shrunk to `SLICE`, 4 routed experts, one dense layer first where it has leading dense layers."""
    fields = dict(SLICE)
    if model.num_experts:  # 4 experts: the same parameters per expert, a CPU step in a second
        fields |= {"num_experts": 4, "moe_router_topk": min(model.moe_router_topk, 2)}
    if model.num_experts and model.num_dense_layers:
        fields["num_dense_layers"] = 1
    if model.moe_shared_expert_intermediate_size and model.moe_ffn_hidden_size:  # shared experts kept in number
        ratio = max(1, model.moe_shared_expert_intermediate_size // model.moe_ffn_hidden_size)
        fields["moe_shared_expert_intermediate_size"] = SLICE["moe_ffn_hidden_size"] * ratio
    if model.attention == "mla":  # ranks shrunk too (a q down-projection kept where the model has one)
        fields.pop("num_query_groups")
        fields.pop("kv_channels")
        fields |= {"kv_lora_rank": 16, "qk_head_dim": 16, "qk_pos_emb_head_dim": 8, "v_head_dim": 16}
        fields["q_lora_rank"] = 32 if model.q_lora_rank else 0
    return dataclasses.replace(model, **fields)


def build_on_cpu(root: RootConfig) -> str:
    """Build `root.optimizer` (algorithm, routing and AdamW configs through `muonbench.schema.optim_configs`) on a
    tiny CPU slice of `root.model` (transformers' model of its family, `bench.models.hf_build`) and take one step.

    Returns:
        What was built, one line.

    Raises:
        ValueError: the optimizer cannot be built or its step fails (naming the model and the error).
    """
    import torch

    from bench.models.hf_build import build_model
    from muonbench.schema import optim_configs
    from optim.hybrid import build_optimizer
    from optim.routing import SplitLayout

    tiny = slice_of(root.model)
    algo, routing, adamw = optim_configs(root.optimizer)
    try:
        net = build_model(tiny, seed=0)
        named = list(net.named_parameters())
        opt = build_optimizer(
            named, algo, naming="hf", routing=routing, layout=SplitLayout.from_hf_config(net.config), adamw=adamw
        )
        gen = torch.Generator().manual_seed(0)
        for _, p in named:
            p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype) * 1e-2
        opt.step()
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ValueError(
            f"model={root.model.name!r}: the optimizer does not build on a CPU slice: {exc}"
        ) from exc
    bad = [n for n, p in named if not torch.isfinite(p).all()]
    if bad:
        raise ValueError(f"model={root.model.name!r}: one CPU step left non-finite weights in {bad[:3]}")
    n_matrix = sum(1 for r in opt.routes if r.optimizer == "matrix")
    return (
        f"{type(algo).__name__} built and stepped on a CPU slice of {root.model.name} ({tiny.num_layers} layers, "
        f"hidden {tiny.hidden_size}, {n_matrix} parameters to the matrix optimizer)"
    )
