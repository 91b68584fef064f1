"""Composition and cross-group validation of the config tree (muonbench/compose.py)."""

from __future__ import annotations

import pytest

from muonbench import ConfigError, config_hash, load
from muonbench.compose import check_runnable


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
        (["parallelism.distribution.tp_mode=sideways"], "parallelism.distribution.tp_mode"),
        (["engine.device=cuda"], "engine.backend"),
        (["engine.manual_gc=true"], "engine.manual_gc"),
        (["engine.empty_unused_memory_level=1"], "engine.empty_unused_memory_level"),
        (["engine.moe_permute_fusion=true"], "engine.moe_permute_fusion"),
        (["engine=bridge", "hardware=h200", "engine.apply_rope_fusion=true"], "engine.apply_rope_fusion"),
        (["engine.moe_router_fusion=true"], "engine.moe_router_fusion"),
        (["engine=bridge", "hardware=h200", "engine.moe_router_dtype=none"], "engine.moe_router_dtype"),
        (["engine.grad_reduce_in_fp32=false"], "engine.grad_reduce_in_fp32"),
        (["engine=megatron", "hardware=h200", "engine.moe_router_dtype=bf16"], "engine.moe_router_dtype"),
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
    from muonbench import schema as S
    from muonbench.schema import optim_configs as convert
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


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optimizer.lr=-1"], "optimizer.lr=-1.0: is not in [0.0, inf]"),
        (["optimizer.momentum=1.5"], "optimizer.momentum=1.5: is not in [0.0, 1.0)"),
        (["optimizer.weight_decay=-0.1"], "optimizer.weight_decay=-0.1: is not in [0.0, inf]"),
        (["optimizer.num_ns_steps=0"], "optimizer.num_ns_steps=0: is not in [1, 100]"),
        (["optimizer.adam_beta2=2"], "optimizer.adam_beta2=2.0: is not in [0.0, 1.0)"),
        (["optimizer=adamw", "optimizer.adam_beta1=1"], "optimizer.adam_beta1=1.0: is not in [0.0, 1.0)"),
        (["optimizer=soap_rekls", "optimizer.adam_eps=0"], "optimizer.adam_eps=0.0: is not in (0.0, 1.0]"),
        (["optimizer=mop", "optimizer.momentum=-0.5"], "optimizer.momentum=-0.5: is not in [0.0, 1.0)"),
        (["optimizer.lr_warmup_steps=-1"], "optimizer.lr_warmup_steps=-1: must be >= 0"),
        (["parallelism.tp=2"], "parallelism.tp=2: the hf engine is data parallel only (allowed: 1)"),
        (
            ["optimizer=muon_megatron"],
            "optimizer.implementation='megatron': the hf engine runs muon as ['ours']",
        ),
        (["precision=fp8_mx"], "precision.name='fp8_mx': the hf engine has no FP8 path"),
        (
            ["engine=megatron", "hardware=h200", "optimizer=mop", "optimizer.implementation=megatron"],
            "optimizer.implementation='megatron': only muon is built into Megatron",
        ),
        (["bench.steps=-5"], "bench.steps=-5: must be >= 1"),
        (["bench.steps=0"], "bench.steps=0: must be >= 1"),
        (["bench.warmup_steps=-1"], "bench.warmup_steps=-1: must be >= 0"),
        (["bench.steps=4", "bench.warmup_steps=4"], "bench.warmup_steps=4: must be < bench.steps=4"),
        (["bench.timeout_s=0"], "bench.timeout_s=0: must be >= 1"),
        (["bench.budget_s=-1"], "bench.budget_s=-1.0: must be a finite number of seconds >= 0"),
        (["bench.budget_s=inf"], "bench.budget_s=inf: must be a finite number of seconds >= 0"),
        (
            ["experiment=gb300/nonexistent"],
            "experiment=gb300/nonexistent: no such option; available: cpu/hf_tiny_dp2, cpu/qwen3_moe",
        ),
    ],
)
def test_bad_input_fails_at_compose_time_naming_the_field(overrides: list[str], message: str) -> None:
    """Localises out-of-range optimizer values, engine mismatches and bench protocol values that were caught only
    inside every rank after torchrun started (or never), with messages that lacked the field path."""
    with pytest.raises(ConfigError) as info:
        check_runnable(load(overrides))
    assert str(info.value).startswith(message), str(info.value)


def test_engine_rules_apply_to_runs_not_to_the_analysis_tools() -> None:
    """bench.flops / balance / project compose layouts no local engine runs (EP8 with the default hf engine)."""
    root = load(["model=qwen3_30b_a3b", "parallelism=dp8_ep8"])
    with pytest.raises(ConfigError, match=r"^parallelism.ep=8: the hf engine is data parallel only"):
        check_runnable(root)
    check_runnable(load(["model=qwen3_30b_a3b", "parallelism=dp8_ep8", "engine=megatron", "hardware=h200"]))


def test_nested_experiment_error_lists_every_experiment() -> None:
    with pytest.raises(ConfigError) as info:
        load(["experiment=gb300/nonexistent"])
    assert "gb300/kimi_k2_muon" in str(info.value) and "h200/qwen3_30b_a3b_slice_muon_1gpu" in str(info.value)


def test_no_undocumented_knob_bench_run_name() -> None:
    """`bench.run_name` was documented and never read: it is not a field any more."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises((ConfigError, ConfigCompositionException), match="run_name"):
        load(["bench.run_name=x"])


def test_distribution_is_a_parallelism_field_not_an_optimizer_field() -> None:
    """Which algorithm (`optimizer`) and how it is spread over ranks (`parallelism.distribution`) are separate."""
    from dataclasses import fields

    from muonbench import schema

    dist_fields = {f.name for f in fields(schema.DistributionConfig)}
    for opt_schema in schema.OPTIMIZER_SCHEMAS.values():
        assert not dist_fields & {f.name for f in fields(opt_schema)}, opt_schema.__name__
    root = load(["optimizer=muon_megatron", "parallelism.distribution.bucket_numel=1000"])
    assert (root.parallelism.distribution.grad_sync, root.parallelism.distribution.bucket_numel) == (
        "all_reduce",
        1000,
    )
    assert load([]).parallelism.distribution == schema.DistributionConfig()
    with pytest.raises(ConfigError, match="tp_mode"):
        load(["optimizer.tp_mode=duplicated"])


def test_optimizer_schema_fields_are_the_optim_config_fields() -> None:
    """No parallel copy: every field of an algorithm config and of RoutingConfig is an optimizer field of the same
    name, and a value set in the Hydra tree arrives unchanged in the `optim` config."""
    from dataclasses import fields

    from muonbench import schema
    from optim.configs import RoutingConfig

    for name, opt_schema in schema.optimizer_schemas().items():
        if name == "adamw":
            continue
        algo, have = opt_schema.ALGORITHM, {f.name for f in fields(opt_schema)}
        assert {f.name for f in fields(algo)} | {f.name for f in fields(RoutingConfig)} <= have, name
    overrides = ["gram_restart_iterations=[3]", "use_gram_ns=true", "weight_decay_method=independent"]
    root = load(["optimizer=muon", "optimizer.split_mla_kv_down=true", *(f"optimizer.{o}" for o in overrides)])
    algo, routing, _ = schema.optim_configs(root.optimizer)
    assert (algo.gram_restart_iterations, algo.use_gram_ns, algo.weight_decay_method) == ((3,), True, "independent")
    assert routing.split_mla_kv_down
    with pytest.raises(ConfigError, match=r"optimizer.weight_decay_method='l1'.*decoupled"):
        load(["optimizer.weight_decay_method=l1"])


def test_run_record_config_round_trips_and_old_records_lift_their_distribution() -> None:
    from muonbench import as_dict, config_from_dict
    from muonbench.schema import DistributionConfig

    root = load(["optimizer=muon_megatron"])
    assert config_from_dict(as_dict(root)) == root
    old = as_dict(root)
    old["optimizer"] = {**old["optimizer"], "grad_sync": "all_reduce", "tp_mode": "duplicated"}
    del old["parallelism"]["distribution"]
    lifted = config_from_dict(old)
    assert lifted.parallelism.distribution == DistributionConfig(grad_sync="all_reduce", tp_mode="duplicated")
    assert lifted.optimizer == root.optimizer
    # Records written before the routing fields took RoutingConfig's names.
    renamed = as_dict(root)
    opt = renamed["optimizer"]
    opt["split_mla"], opt["router_to_matrix_optimizer"] = opt.pop("split_mla_kv_down"), opt.pop("router_to_matrix")
    opt["router_to_matrix_optimizer"] = False
    assert config_from_dict(renamed).optimizer.router_to_matrix is False
