"""Offline checks of the Megatron-Bridge recipes (recipes/): every override names a real Bridge field, read from the
installed megatron-bridge SOURCE with `ast` (Bridge itself needs Transformer Engine and cannot be imported here),
the published layouts, the benchmark policy, and the published-vs-fair A/B difference.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import pytest

from muonbench import CONF_DIR, load
from muonbench.schema import LAYERWISE_FIELDS
from recipes import fields as F
from recipes.models import MODEL_RECIPES
from recipes.overrides import PRECISION_PRESETS, SECTION_CLASSES, build_plan, unknown_fields

pytestmark = pytest.mark.filterwarnings("ignore")


def _bridge_experiments() -> list[str]:
    """Every experiment YAML that runs the bridge engine (discovered, not listed)."""
    out = []
    for path in sorted(CONF_DIR.glob("experiment/**/*.yaml")):
        if "override /engine: bridge" in path.read_text():
            out.append(str(path.relative_to(CONF_DIR / "experiment").with_suffix("")))
    return out


EXPERIMENTS = _bridge_experiments()
HF_FIXTURE = Path(__file__).parent / "fixtures" / "hf_configs" / "olmoe_1b_7b"
"""The model given to experiments that read it from a Hugging Face config (`override /model: hf`)."""


def _model_of(experiment: str) -> list[str]:
    text = (CONF_DIR / "experiment" / f"{experiment}.yaml").read_text()
    return [f"model=hf:{HF_FIXTURE}", "model.num_layers=2"] if "override /model: hf" in text else []
# Every optimizer route through a Bridge recipe, on top of the published Qwen and Kimi layouts.
OPTIMIZER_VARIANTS = [
    ["optimizer=adamw", "optimizer.implementation=megatron"],
    ["optimizer=muon_megatron"],
    ["optimizer=muon"],
    ["optimizer=mop"],
    ["optimizer=soap_rekls"],
    [
        "optimizer=soap_rekls",
        "optimizer.implementation=megatron",
        "optimizer.use_eigh=false",
        "parallelism.distribution.grad_sync=all_reduce",
        "parallelism.distribution.assignment=ping_pong_numel",
    ],
]


@functools.cache
def _load(*overrides: str) -> Any:
    return load(list(overrides))


def _plan(*overrides: str, ab_mode: str = "published") -> Any:
    return build_plan(_load(*overrides), ab_mode=ab_mode)


# --------------------------------------------------------------------------------------------------------------
# The field reader itself (so a passing field check means something)
# --------------------------------------------------------------------------------------------------------------
def test_field_reader_sees_own_inherited_and_mcore_fields() -> None:
    """Localises a broken AST walk: own fields, Bridge bases, and Megatron-Core bases must all be collected."""
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    mla = F.dataclass_fields("megatron.bridge.models.mla_provider", "MLAModelProvider")
    assert {f.name for f in dataclasses.fields(TransformerConfig)} <= mla
    assert {f.name for f in dataclasses.fields(MLATransformerConfig)} <= mla
    assert {"qk_clip", "moe_flex_dispatcher_backend"} <= mla  # Bridge-level fields of the provider chain
    opt = F.dataclass_fields("megatron.bridge.training.config", "OptimizerConfig")
    assert {f.name for f in dataclasses.fields(OptimizerConfig)} == opt
    container = F.dataclass_fields("megatron.bridge.training.config", "ConfigContainer")
    assert set(SECTION_CLASSES) | {"model", "env_vars"} <= container
    assert "definitely_not_a_field" not in mla


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("megatron.core.transformer.transformer_config", "TransformerConfig"),
        ("megatron.core.transformer.transformer_config", "MLATransformerConfig"),
        ("megatron.core.optimizer", "OptimizerConfig"),
        ("megatron.core.distributed", "DistributedDataParallelConfig"),
        ("megatron.core.datasets.gpt_dataset", "GPTDatasetConfig"),
        *(("megatron.training.config", c) for c in ("TrainingConfig", "CheckpointConfig", "RNGConfig")),
        ("megatron.training.config.container", "ConfigContainerBase"),
    ],
)
def test_field_reader_parses_megatron_sources_as_the_classes_define_them(module: str, name: str) -> None:
    """Localises a source walk of Megatron-Core / megatron.training (read, not imported: see recipes.fields) that
    misses or invents a field, or resolves a package's imports against the wrong module."""
    import importlib

    cls = getattr(importlib.import_module(module), name)
    assert F.dataclass_fields(module, name) == {f.name for f in dataclasses.fields(cls)}


def test_unknown_fields_imports_no_megatron_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check `launcher=slurm` runs on a login node reads sources only: importing Megatron-Core or
    megatron.training for a few field names cost about 30 s of CPU per submission."""
    imported: list[str] = []
    real = F.importlib.import_module
    monkeypatch.setattr(F.importlib, "import_module", lambda m, *a: imported.append(m) or real(m, *a))
    F.dataclass_fields.cache_clear()
    try:
        assert unknown_fields(_plan("experiment=gb300/kimi_k2_muon")) == []
    finally:
        F.dataclass_fields.cache_clear()
    assert [m for m in imported if m.startswith("megatron")] == [], imported


def test_unknown_fields_reports_a_renamed_field() -> None:
    """A Bridge rename must fail: an override with a made-up name is reported, section-qualified."""
    plan = _plan("experiment=gb300/kimi_k2_muon")
    assert unknown_fields(plan) == []
    plan.overrides["optimizer"]["muon_use_nesterov_renamed"] = True
    plan.overrides["not_a_section"] = {"x": 1}
    assert set(unknown_fields(plan)) == {"optimizer.muon_use_nesterov_renamed", "not_a_section"}


# --------------------------------------------------------------------------------------------------------------
# Every recipe, experiment and optimizer route: overrides are real Bridge fields
# --------------------------------------------------------------------------------------------------------------
def test_experiments_discovered() -> None:
    assert {
        "gb300/kimi_k2_muon",
        "gb300/kimi_k2_adamw",
        "gb300/qwen3_30b_a3b_muon",
        "gb300/qwen3_30b_a3b_adamw",
    } <= set(EXPERIMENTS)


@pytest.mark.parametrize("ab_mode", ["published", "fair"])
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_overrides_are_bridge_fields(experiment: str, ab_mode: str) -> None:
    plan = _plan(f"experiment={experiment}", *_model_of(experiment), ab_mode=ab_mode)
    assert unknown_fields(plan) == []
    assert plan.metadata["ab_mode"] == ab_mode


@pytest.mark.parametrize("variant", OPTIMIZER_VARIANTS, ids=lambda v: "+".join(v))
@pytest.mark.parametrize("experiment", ["gb300/kimi_k2_muon", "gb300/qwen3_30b_a3b_muon"])
def test_optimizer_routes_are_bridge_fields(experiment: str, variant: list[str]) -> None:
    plan = _plan(f"experiment={experiment}", *variant)
    assert unknown_fields(plan) == []


@pytest.mark.parametrize("model", ["kimi_k2_tiny", "qwen3_moe_tiny", "kimi_k2_slice", "qwen3_30b_a3b_slice"])
def test_proxy_models_on_one_gpu(model: str) -> None:
    """The proxies turn a Bridge recipe into a one-GPU smoke run: shapes from our config, no EP dispatcher knobs."""
    root = _load(
        f"model={model}",
        "parallelism=single_gpu",
        "engine=bridge",
        "hardware=h200",
        "precision=bf16",
        "optimizer=muon_megatron",
    )
    plan = build_plan(root)
    assert unknown_fields(plan) == []
    m = plan.overrides["model"]
    assert (m["num_layers"], m["hidden_size"], m["num_moe_experts"]) == (
        root.model.num_layers,
        root.model.hidden_size,
        root.model.num_experts,
    )
    assert m["expert_model_parallel_size"] == 1 and "moe_flex_dispatcher_backend" not in m
    assert (
        m["moe_token_dispatcher_type"] == "alltoall"
    )  # the recipe's flex dispatcher needs DeepEP / HybridEP
    assert (
        plan.precision_preset == "bf16_mixed" and "fp8_param_gather" not in plan.overrides["mixed_precision"]
    )


@pytest.mark.parametrize("family", sorted(MODEL_RECIPES))
def test_recipe_entry_points_exist_in_bridge_source(family: str) -> None:
    """The base recipe function, provider class and precision presets named by recipes/ exist in the source."""
    recipe = MODEL_RECIPES[family]
    module, _, func = recipe.base_recipe.partition(":")
    assert F.function_defined(module, func), recipe.base_recipe
    module, _, cls = recipe.provider.partition(":")
    assert "num_layers" in F.dataclass_fields(module, cls)
    for preset in PRECISION_PRESETS.values():
        assert F.function_defined("megatron.bridge.training.mixed_precision", preset), preset


# --------------------------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------------------------
def _mb_kimi_layout(pp: int, vp: int) -> list[list[str]]:
    """MB's own `_get_kimi_k2_pipeline_layout`, executed from its source (plain Python, no imports)."""
    path = Path(str(F._module_path("megatron.bridge.recipes.kimi.h100.kimi_k2")))
    tree = ast.parse(path.read_text())
    fn = next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_get_kimi_k2_pipeline_layout"
    )
    fn.returns = None
    for a in fn.args.args:
        a.annotation = None
    ns: dict[str, Any] = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), ns)  # noqa: S102 - MB source, no imports
    return ns["_get_kimi_k2_pipeline_layout"](pp, vp)


def test_kimi_k2_layout_matches_published() -> None:
    """PP4 VP4 DP64 EP64 on 64 nodes x 4 GPUs, MBS 2, GBS 4096, and MB's pipeline layout stage by stage."""
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    root = _load("experiment=gb300/kimi_k2_muon")
    par, m = root.parallelism, _plan("experiment=gb300/kimi_k2_muon").overrides["model"]
    assert (par.world_size, par.nodes, par.gpus_per_node) == (256, 64, 4)
    assert par.tp * par.pp * par.dp * par.cp == 256 and par.dp == 64 and par.expert_dp == 1
    assert (
        m["tensor_model_parallel_size"],
        m["pipeline_model_parallel_size"],
        m["virtual_pipeline_model_parallel_size"],
        m["expert_model_parallel_size"],
    ) == (1, 4, 4, 64)
    train = _plan("experiment=gb300/kimi_k2_muon").overrides["train"]
    assert (train["micro_batch_size"], train["global_batch_size"]) == (2, 4096)
    assert par.grad_accum == 32
    stages = PipelineParallelLayerLayout.parse_str_to_list(m["pipeline_model_parallel_layout"])
    assert len(stages) == 16
    assert sum(t.name == "decoder" for s in stages for t in s) == m["num_layers"] == 61
    assert [[t.name for t in s] for s in stages] == _mb_kimi_layout(4, 4)


def test_qwen3_layout_matches_published() -> None:
    plan = _plan("experiment=gb300/qwen3_30b_a3b_muon")
    m, train = plan.overrides["model"], plan.overrides["train"]
    par = _load("experiment=gb300/qwen3_30b_a3b_muon").parallelism
    assert (par.world_size, par.dp, par.ep, par.expert_dp) == (8, 8, 8, 1)
    assert m["virtual_pipeline_model_parallel_size"] is None and m["pipeline_model_parallel_layout"] is None
    assert (m["expert_model_parallel_size"], train["micro_batch_size"], train["global_batch_size"]) == (
        8,
        8,
        512,
    )
    assert m["moe_layer_freq"] == 1 and m["num_moe_experts"] == 128


# --------------------------------------------------------------------------------------------------------------
# Published settings, benchmark policy, A/B modes
# --------------------------------------------------------------------------------------------------------------
def test_kimi_published_model_and_muon_settings() -> None:
    """docs/references.md#nvidia-table1, #mb-perf-recipes: recompute mla_up_proj, flex/hybridep, forced balance, and MB's dist_muon branch."""
    o = _plan("experiment=gb300/kimi_k2_muon").overrides
    m, opt = o["model"], o["optimizer"]
    assert (m["recompute_granularity"], m["recompute_modules"]) == ("selective", ["mla_up_proj"])
    assert (m["moe_token_dispatcher_type"], m["moe_flex_dispatcher_backend"], m["moe_hybridep_num_sms"]) == (
        "flex",
        "hybridep",
        32,
    )
    assert m["moe_router_force_load_balancing"] is True and m["qk_clip"] is False
    assert opt["optimizer"] == "dist_muon" and opt["use_distributed_optimizer"] is False
    assert (
        opt["muon_momentum"],
        opt["muon_nesterov"],
        opt["muon_scale_mode"],
        opt["muon_fp32_matmul_prec"],
        opt["muon_num_ns_steps"],
        opt["muon_coefficient_type"],
        opt["muon_tp_mode"],
    ) == (0.95, True, "spectral", "medium", 5, "quintic", "blockwise")
    assert (opt["lr"], opt["min_lr"], opt["clip_grad"], o["scheduler"]["start_weight_decay"]) == (
        3e-4,
        3e-5,
        1.0,
        0.033,
    )
    adam = _plan("experiment=gb300/kimi_k2_adamw").overrides["optimizer"]
    assert (adam["optimizer"], adam["use_distributed_optimizer"], adam["adam_beta2"], adam["adam_eps"]) == (
        "adam",
        True,
        0.95,
        1e-8,
    )


def test_benchmark_policy() -> None:
    """MB _benchmark_common: 50 iterations, LR warm-up 10, log every step, no checkpoint, no eval, mock data."""
    o = _plan("experiment=gb300/qwen3_30b_a3b_adamw").overrides
    assert o["train"]["train_iters"] == 50 and o["scheduler"]["lr_warmup_iters"] == 10
    assert o["scheduler"]["lr_decay_iters"] == 50 and o["logger"]["log_interval"] == 1
    assert o["checkpoint"]["save"] is None and o["validation"]["eval_iters"] == 0
    assert o["dataset"]["blend"] is None and o["tokenizer"]["tokenizer_type"] == "NullTokenizer"
    assert o["tokenizer"]["vocab_size"] == 151936
    assert o["model"]["cuda_graph_scope"] == ["moe_router", "moe_preprocess"]
    indexed = _plan("experiment=gb300/qwen3_30b_a3b_adamw", "bench.data=indexed:/data/pile_text_document")
    assert indexed.overrides["dataset"]["blend"] == (["/data/pile_text_document"], None)


_AB = [
    ("ddp", "overlap_param_gather"),
    ("optimizer", "overlap_param_gather"),
    ("mixed_precision", "fp8_param_gather"),
    ("mixed_precision", "reuse_grad_buf_for_mxfp8_param_ag"),
]


def _ab_values(plan: Any) -> dict[tuple[str, str], Any]:
    return {(s, k): plan.overrides[s][k] for s, k in _AB}


@pytest.mark.parametrize(("model", "adam_fp8_gather"), [("kimi_k2", False), ("qwen3_30b_a3b", True)])
def test_published_ab_differs_and_fair_ab_is_equal(model: str, adam_fp8_gather: bool) -> None:
    """Published (MB 0.6.2 GB300 perf recipes): AdamW overlaps its param gather and gathers in MXFP8 where its recipe
    does (Qwen3-30B-A3B: the MXFP8 preset's default; Kimi K2: its recipe sets it off); Muon does neither. Fair: one
    profile for both."""
    adam_pub, muon_pub = (_plan(f"experiment=gb300/{model}_{o}") for o in ("adamw", "muon"))
    adam_fair, muon_fair = (_plan(f"experiment=gb300/{model}_{o}", ab_mode="fair") for o in ("adamw", "muon"))
    pub = _ab_values(adam_pub)
    assert pub[("ddp", "overlap_param_gather")] is True
    assert pub[("mixed_precision", "fp8_param_gather")] is adam_fp8_gather
    assert pub[("mixed_precision", "reuse_grad_buf_for_mxfp8_param_ag")] is adam_fp8_gather
    assert not any(_ab_values(muon_pub).values())
    assert _ab_values(adam_fair) == _ab_values(muon_fair) and all(_ab_values(muon_fair).values())
    assert muon_fair.metadata["ab_replaced"] == {"overlap_param_gather": False, "fp8_param_gather": False}
    assert muon_fair.metadata["requires"] == {"megatron-core": ">=0.19"}
    # Each optimizer keeps its own state sharding in both modes.
    assert muon_fair.overrides["ddp"]["use_distributed_optimizer"] is False
    assert adam_fair.overrides["ddp"]["use_distributed_optimizer"] is True


def test_ours_goes_through_the_adapter_without_param_gather() -> None:
    """Ours at DP 64: the layer-wise optimizer reduce-scatters gradients itself, so DDP's overlapped grad reduce
    (on in the Kimi K2 recipe) is switched off, and the metadata says what is applied."""
    plan = _plan("experiment=gb300/kimi_k2_muon", "optimizer=muon", ab_mode="fair")
    assert plan.optimizer_impl == "ours" and plan.overrides["optimizer"]["optimizer"] == "adam"
    assert not any(_ab_values(plan).values()) and plan.overrides["ddp"]["use_distributed_optimizer"] is False
    assert plan.overrides["ddp"]["overlap_grad_reduce"] is False
    assert plan.overrides["comm_overlap"]["overlap_grad_reduce"] is False
    meta = plan.metadata["optimizer"]
    dist = _load("experiment=gb300/kimi_k2_muon", "optimizer=muon").parallelism.distribution
    assert meta["ours_distribution"] == {"distributed": "layerwise", **{k: getattr(dist, k) for k in LAYERWISE_FIELDS}}
    assert meta["not_applied"] == {}
    other = _plan(
        "experiment=gb300/kimi_k2_muon", "optimizer=muon", "parallelism.distribution.assignment=round_robin"
    )
    assert other.metadata["optimizer"]["not_applied"] == {}  # the adapter takes every distribution field
    assert other.metadata["optimizer"]["ours_distribution"]["assignment"] == "round_robin"
    replicated = _plan(
        "experiment=gb300/kimi_k2_muon", "optimizer=muon", "parallelism.distribution.distributed=none"
    )
    assert replicated.overrides["ddp"]["overlap_grad_reduce"] is True  # the recipe's, kept: DDP all-reduces


def test_one_gpu_proxy_uses_the_all_to_all_dispatcher() -> None:
    """EP = 1: no flex / HybridEP dispatcher (it needs DeepEP or HybridEP installed, for nothing to dispatch)."""
    plan = _plan("model=qwen3_moe_tiny", "parallelism=single_gpu", "optimizer=muon")
    assert plan.overrides["model"]["moe_token_dispatcher_type"] == "alltoall"
    assert "moe_flex_dispatcher_backend" not in plan.overrides["model"]
    assert "moe_hybridep_num_sms" not in plan.overrides["model"]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["optimizer=mop", "optimizer.implementation=megatron"], "MOP rejects"),
        (["optimizer=soap_rekls", "optimizer.implementation=megatron"], "use_eigh"),
        (["optimizer.split_mla_kv_down=true"], "split_mla_kv_down"),
        (["parallelism.distribution.tp_mode=distributed_gram"], r"parallelism\.distribution\.tp_mode="),
        (["parallelism.distribution.grad_sync=reduce_scatter"], r"parallelism\.distribution\.grad_sync="),
        (["optimizer=adamw", "optimizer.implementation=ours"], "AdamW"),
        (["optimizer.implementation=eo"], "oracle"),
        (["optimizer.ns_precision=fp16"], "ns_precision"),
        (["optimizer.ns_overlap=true"], r"optimizer.ns_overlap=True: engine=megatron only"),
        (["optimizer.ns_overlap=true", "optimizer.implementation=ours"], "ns_overlap"),
        (["bench.data=text:/tmp/x.txt"], "bench.data"),
    ],
)
def test_unsupported_combinations_raise(overrides: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _plan("experiment=gb300/kimi_k2_muon", *overrides)


def test_bad_ab_mode_raises() -> None:
    with pytest.raises(ValueError, match="ab_mode='unfair'"):
        _plan("experiment=gb300/kimi_k2_muon", ab_mode="unfair")


# --------------------------------------------------------------------------------------------------------------
# Applying overrides onto live dataclasses (Megatron-Core's, importable here)
# --------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _LegacyOptimizer:
    optimizer: str = "adam"
    muon_use_nesterov: bool = False


@dataclasses.dataclass
class _Container:
    optimizer: Any
    ddp: Any
    comm_overlap: Any = None


def test_apply_overrides_sets_values_and_refuses_unknown_fields() -> None:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    from recipes.bridge import apply_overrides

    plan = _plan("experiment=gb300/kimi_k2_muon")
    cfg = _Container(optimizer=OptimizerConfig(), ddp=DistributedDataParallelConfig())
    renamed = apply_overrides(cfg, {k: plan.overrides[k] for k in ("optimizer", "ddp")})
    assert renamed == {} and cfg.optimizer.optimizer == "dist_muon" and cfg.optimizer.muon_nesterov is True
    assert cfg.ddp.overlap_grad_reduce is True and cfg.ddp.use_distributed_optimizer is False
    with pytest.raises(ValueError, match="ddp.not_a_field"):
        apply_overrides(cfg, {"ddp": {"not_a_field": 1}})
    legacy = _Container(optimizer=_LegacyOptimizer(), ddp=DistributedDataParallelConfig())
    assert apply_overrides(legacy, {"optimizer": {"muon_nesterov": True}}) == {
        "optimizer.muon_nesterov": "muon_use_nesterov"
    }
    assert legacy.optimizer.muon_use_nesterov is True


def test_build_config_container_names_what_is_missing() -> None:
    """Here (no Transformer Engine) the container cannot be built: the error must say what is missing."""
    from recipes.bridge import build_config_container, missing_modules

    missing = missing_modules()
    if not missing:
        pytest.skip("Megatron-Bridge is importable here: covered by the GPU smoke run instead")
    with pytest.raises(ValueError, match=missing[0]):
        build_config_container(_load("experiment=gb300/kimi_k2_muon"))


# --------------------------------------------------------------------------------------------------------------
# The published process environment and the offline CLI
# --------------------------------------------------------------------------------------------------------------
def _mb_env_vars(module: str, function: str) -> dict[str, str]:
    """`cfg.env_vars = {**COMMON_PERF_ENV_VARS, ...}` of an MB perf recipe, read from source."""
    tree = ast.parse(Path(str(F._module_path(module))).read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    target = next(
        n.value
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Attribute)
        and n.targets[0].attr == "env_vars"
    )
    assert isinstance(target, ast.Dict)
    common_tree = ast.parse(Path(str(F._module_path("megatron.bridge.perf_recipes.environment"))).read_text())
    common = next(
        n.value
        for n in common_tree.body
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "COMMON_PERF_ENV_VARS"
    )
    out = {str(k): str(v) for k, v in ast.literal_eval(common).items()}
    out |= {ast.literal_eval(k): str(ast.literal_eval(v)) for k, v in zip(target.keys, target.values) if k}
    return out


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_kimi_environment_is_mb_perf_recipe_environment(optimizer: str) -> None:
    """launcher.env of the Kimi experiments == env_vars of MB's kimi_k2_pretrain_256gpu_gb300_fp8mx_config."""
    env = _load(f"experiment=gb300/kimi_k2_{optimizer}").launcher.env
    mb = _mb_env_vars(
        "megatron.bridge.perf_recipes.kimi.gb300.kimi_k2", "kimi_k2_pretrain_256gpu_gb300_fp8mx_config"
    )
    assert dict(env) == mb


def test_cli_prints_plan_and_checks_fields(capsys: pytest.CaptureFixture[str]) -> None:
    from recipes.__main__ import main

    assert main(["experiment=gb300/kimi_k2_muon", "--ab-mode", "fair"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["metadata"]["ab_mode"] == "fair" and doc["overrides"]["ddp"]["overlap_param_gather"] is True
    assert "every override is a known field" in out.err
    assert main(["experiment=gb300/kimi_k2_muon", "optimizer=mop", "optimizer.implementation=megatron"]) == 2
    assert main(["experiment=gb300/kimi_k2_muon", "--ab-mode", "best"]) == 2
