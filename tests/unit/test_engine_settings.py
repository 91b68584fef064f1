"""A setting an engine cannot honour is refused before launch naming the engine; the layer-wise optimizer of every
engine that runs it takes every `parallelism.distribution` field (the Megatron adapter built its config from
`clip_grad` alone and ran lpt_cost / reduce_scatter whatever was asked)."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

import muonbench
from muonbench.schema import LAYERWISE_FIELDS, DistributionConfig

ASKED = [
    "parallelism.distribution.assignment=round_robin",
    "parallelism.distribution.grad_sync=all_reduce",
    "parallelism.distribution.bucket_numel=1234",
    "parallelism.distribution.collective=padded",
    "parallelism.distribution.overlap_param_gather=false",
    "optimizer.clip_grad=0.5",
]


def _carries(config) -> None:
    assert (config.strategy, config.grad_sync, config.bucket_numel, config.collective) == (
        "round_robin", "all_reduce", 1234, "padded"
    )  # fmt: skip
    assert config.overlap_param_gather is False and config.max_grad_norm == 0.5


def test_every_distribution_field_has_a_layerwise_field() -> None:
    """Localises a new `parallelism.distribution` field that no engine hands to the layer-wise optimizer."""
    from optim.distributed.layerwise import LayerWiseConfig

    choose = {"tp_mode", "distributed"}  # which optimizer runs, not its layer-wise config
    assert set(LAYERWISE_FIELDS) == {f.name for f in fields(DistributionConfig)} - choose
    assert set(LAYERWISE_FIELDS.values()) <= {f.name for f in fields(LayerWiseConfig)}


def test_hf_engine_layerwise_config_carries_the_distribution() -> None:
    from bench.engines.hf import layerwise_config

    _carries(layerwise_config(muonbench.load(["parallelism=cpu_dp2", *ASKED])))


def test_megatron_adapter_layerwise_carries_the_distribution() -> None:
    """The object the megatron engine (and Bridge's `provide()`) builds: `MegatronLayerWise` on one rank."""
    from bench.engines.megatron_optim import layerwise_config
    from optim.megatron import MegatronLayerWise

    cfg = muonbench.load(["engine=megatron", "hardware=h200", *ASKED])
    named = [("w", torch.nn.Parameter(torch.randn(4, 4))), ("b", torch.nn.Parameter(torch.zeros(4)))]

    def build(lw_config):
        return MegatronLayerWise(
            named,
            lambda owned: torch.optim.SGD([t for _, t in owned], lr=0.1),
            is_matrix=lambda name, p: p.ndim == 2,
            is_expert=lambda name: False,
            dp_group=None,
            expert_dp_group=None,
            clip_grad=cfg.optimizer.clip_grad,
            config=lw_config,
        )

    _carries(build(layerwise_config(cfg)).layerwise.config)
    on = muonbench.load(
        ["engine=megatron", "hardware=h200", "parallelism.distribution.overlap_param_gather=true"]
    )
    with pytest.raises(ValueError, match="overlap_param_gather=True: the Megatron adapter"):
        build(layerwise_config(on))


def test_bridge_plan_records_every_distribution_field_as_applied() -> None:
    from recipes.overrides import build_plan

    root = muonbench.load(["experiment=gb300/kimi_k2_muon", "optimizer=muon", *ASKED])
    meta = build_plan(root).metadata["optimizer"]
    assert meta["not_applied"] == {}
    assert (
        meta["ours_distribution"]["assignment"] == "round_robin"
        and meta["ours_distribution"]["bucket_numel"] == 1234
    )


@pytest.mark.parametrize("engine", ["megatron", "bridge"])
def test_overlap_the_adapter_cannot_do_is_refused_naming_the_engine(engine: str) -> None:
    base = ["model=qwen3_30b_a3b", "parallelism=dp8_ep8", f"engine={engine}", "hardware=h200"]
    muonbench.check_runnable(muonbench.load(base))
    with pytest.raises(
        muonbench.ConfigError,
        match=rf"^parallelism.distribution.overlap_param_gather=True: the {engine} engine's layer-wise",
    ):
        muonbench.check_runnable(muonbench.load([*base, "parallelism.distribution.overlap_param_gather=true"]))


@pytest.mark.parametrize(("engine", "refused"), [("hf", True), ("bridge", True), ("megatron", False)])
def test_qkv_bias_is_refused_where_the_family_decides_it(engine: str, refused: bool) -> None:
    """Localises `model.qkv_bias=true` built only by the megatron engine and dropped by the other two."""
    extra = [] if engine == "hf" else ["hardware=h200", "parallelism=single_gpu"]
    root = muonbench.load([f"engine={engine}", *extra, "model.qkv_bias=true"])
    if refused:
        with pytest.raises(muonbench.ConfigError, match=rf"^model.qkv_bias=True: the {engine} engine builds"):
            muonbench.check_runnable(root)
    else:
        muonbench.check_runnable(root)
        from bench.engines.megatron_model import build_options, transformer_config_kwargs

        opts = build_options(root, use_te=False, grouped_mm_experts=False)
        assert transformer_config_kwargs(root.model, root.parallelism, opts)[1]["add_qkv_bias"] is True
