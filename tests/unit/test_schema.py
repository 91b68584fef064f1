"""Composition and cross-group validation of the config tree (config/compose.py)."""

from __future__ import annotations

import pytest

from config import ConfigError, config_hash, load


def test_default_composes_typed() -> None:
    root = load([])
    assert type(root.optimizer).__name__ == "MuonSchema"
    assert root.parallelism.dp == 2


def test_unknown_option_lists_available() -> None:
    with pytest.raises(ConfigError, match="qwen3_moe_tiny"):
        load(["model=does_not_exist"])


def test_typo_in_field_fails_at_compose() -> None:
    with pytest.raises(Exception, match="momentun"):
        load(["optimizer.momentun=0.9"])


def test_wrong_type_fails_at_compose() -> None:
    with pytest.raises(Exception, match="num_ns_steps"):
        load(["optimizer.num_ns_steps=five"])


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (
            ["parallelism.world_size=3", "parallelism.gpus_per_node=3", "parallelism.tp=2"],
            "parallelism.world_size",
        ),
        (["parallelism.ep=3", "parallelism.world_size=6", "parallelism.gpus_per_node=6"], "parallelism.ep"),
        (["parallelism.gbs=7"], "parallelism.gbs"),
        (["parallelism.pp=2", "parallelism.vp=3"], "model.num_layers"),
        (["optimizer.tp_mode=sideways"], "optimizer.tp_mode"),
        (["engine.device=cuda"], "engine.backend"),
        (["engine.manual_gc=true"], "engine.manual_gc"),
        (["engine.empty_unused_memory_level=1"], "engine.empty_unused_memory_level"),
        (["bench.probes=[gpu_energy]"], "bench.probes"),
        (["engine=megatron", "hardware=h200", "bench.probes=[no_such_probe]"], "bench.probes"),
        (["optimizer=muon_megatron", "optimizer.ns_precision=fp16"], "optimizer.ns_precision"),
        (
            ["engine=megatron", "hardware=h200", "engine.empty_unused_memory_level=3"],
            "engine.empty_unused_memory_level",
        ),
    ],
)
def test_layout_rules_name_field_value_rule(overrides: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(overrides)
    assert str(info.value).startswith(field + "=")


def test_hash_changes_with_workload_not_with_bench() -> None:
    a = load([])
    b = load(["bench.steps=50"])
    c = load(["optimizer.num_ns_steps=6"])
    assert config_hash(a) == config_hash(b)
    assert config_hash(a) != config_hash(c)


def test_pipeline_layout_must_hold_the_model() -> None:
    base = ["model=kimi_k2", "parallelism=pp4_dp64_ep64", "engine=bridge", "hardware=gb300"]
    assert load(base).parallelism.vp == 4
    with pytest.raises(ConfigError, match="holds 61 decoder layers; model.num_layers=48"):
        load(["model=qwen3_30b_a3b", "parallelism=pp4_dp64_ep64", "engine=bridge", "hardware=gb300"])
    with pytest.raises(ConfigError, match="must have PP x VP"):
        load([*base, "parallelism.vp=2"])


def test_router_score_function_allowed_set() -> None:
    with pytest.raises(ConfigError, match=r"model.moe_router_score_function='tanh'.*softmax"):
        load(["model.moe_router_score_function=tanh"])


def test_schema_defaults_are_optim_defaults() -> None:
    """One set of defaults: a default optimizer schema converts to the default `optim` config, so the Hydra tree
    and a plain PyTorch user of `optim` start from the same values (the YAMLs state the recipe values)."""
    from config import schema as S
    from config.convert import convert
    from optim.configs import AdamWConfig, MOPConfig, MuonConfig, RoutingConfig, SOAPConfig

    for sch, want in (
        (S.MuonSchema(), MuonConfig()),
        (S.MOPSchema(), MOPConfig()),
        (S.SOAPSchema(), SOAPConfig()),
    ):
        algo, routing, adamw = convert(sch)
        assert algo == want, type(sch).__name__
        assert routing == RoutingConfig()
        assert adamw == AdamWConfig()
    assert convert(S.AdamWSchema())[0] == AdamWConfig()
