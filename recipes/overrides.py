"""Our typed config -> Megatron-Bridge overrides, as pure data (no Megatron import; testable offline).

`build_plan(root)` returns a `BridgePlan`: which Bridge recipe builds the model, which mixed-precision preset, and
`overrides`, a mapping of ConfigContainer section (`model`, `optimizer`, `ddp`, `train`, `scheduler`, ...) to
field -> value, composed from small deltas on a hardware-neutral per-model base:

    base_sections(model) -> apply_parallelism -> apply_precision -> apply_optimizer -> benchmark_mode

Only values that differ from the Bridge base recipe, or that our config decides, are set. `recipes.bridge` applies
the plan onto a live ConfigContainer inside the NeMo container.

A/B modes (`ab_mode`), because the published AdamW vs Muon comparison differed in more than the optimizer:
- "published": the A/B knobs as configured; the `conf/experiment/gb300/*` files encode the MB runs (AdamW:
  distributed optimizer, param-gather overlap and MXFP8 param gather on; Muon: all three off).
- "fair": the knobs that are not the optimizer's own (param-gather overlap, MXFP8 param gather) are forced to one
  profile, `recipes.optimizers.FAIR_PROFILE` (both on), for every optimizer that gathers parameters; each optimizer
  keeps its own state sharding (ZeRO-1 for AdamW, the layer-wise optimizer for Muon). Megatron's Muon then needs
  Megatron-Core >= 0.19 (layer-wise overlapped param gather through the DDP buckets, MXFP8 param gather fixed by
  MCore #5707), checked at run time. Our replicated adapter (implementation=ours) gathers no parameters.
The mode and every knob it changed go into `BridgePlan.metadata` (copied into run.json).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from muonbench.engines import BridgeEngineConfig
from muonbench.schema import (
    BenchConfig,
    HardwareConfig,
    ModelConfig,
    ParallelismConfig,
    PrecisionConfig,
    RootConfig,
)
from recipes.models import (
    AUTOBRIDGE_RECIPE,
    KIMI_K2,
    QWEN3_MOE,
    ModelRecipe,
    Sections,
    base_sections,
    model_recipe,
    shape_fields,
)
from recipes.optimizers import apply_optimizer

AB_MODES = ("published", "fair")
DEFAULT_AB_MODE = "published"
FAIR_MIN_MCORE = (0, 19)

PRECISION_PRESETS: dict[str, str] = {"bf16": "bf16_mixed", "fp8_mx": "bf16_with_mxfp8_mixed"}
"""`precision.name` -> preset function in megatron.bridge.training.mixed_precision."""

_CONFIG = "megatron.bridge.training.config"
SECTION_CLASSES: dict[str, tuple[str, str]] = {
    "train": (_CONFIG, "TrainingConfig"),
    "validation": (_CONFIG, "ValidationConfig"),
    "optimizer": (_CONFIG, "OptimizerConfig"),
    "scheduler": (_CONFIG, "SchedulerConfig"),
    "ddp": (_CONFIG, "DistributedDataParallelConfig"),
    "dataset": (_CONFIG, "GPTDatasetConfig"),
    "logger": (_CONFIG, "LoggerConfig"),
    "checkpoint": (_CONFIG, "CheckpointConfig"),
    "dist": (_CONFIG, "DistributedInitConfig"),
    "rng": (_CONFIG, "RNGConfig"),
    "rerun_state_machine": (_CONFIG, "RerunStateMachineConfig"),
    "tokenizer": ("megatron.bridge.training.tokenizers.config", "TokenizerConfig"),
    "comm_overlap": ("megatron.bridge.training.comm_overlap", "CommOverlapConfig"),
    "mixed_precision": ("megatron.bridge.training.mixed_precision", "MixedPrecisionConfig"),
}
"""ConfigContainer section -> (module, class) of its dataclass; `model` depends on the family (models.py)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BridgePlan:
    """Everything `recipes.bridge` needs to build the ConfigContainer, as plain data."""

    base_recipe: str
    """`module:function` of the Bridge recipe that builds the model."""
    provider: str
    """`module:Class` of the model provider (field check)."""
    precision_preset: str
    """Mixed-precision preset function name (megatron.bridge.training.mixed_precision)."""
    optimizer_impl: str
    """"megatron" (MCore's optimizer named in overrides["optimizer"]) or "ours" (optim.megatron adapter)."""
    overrides: Sections
    model_arg: bool = False
    """The base recipe takes the run's ModelConfig (`recipes.autobridge.pretrain_config`); else no arguments."""
    env_vars: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def section_class(self, section: str) -> tuple[str, str]:
        """(module, class) of a section's dataclass."""
        if section == "model":
            module, _, cls = self.provider.partition(":")
            return module, cls
        return SECTION_CLASSES[section]


def apply_parallelism(
    sections: Sections, par: ParallelismConfig, model: ModelConfig, hardware: HardwareConfig
) -> None:
    """Layout (TP/PP/VP/CP/EP), batch sizes and the MoE token dispatcher."""
    m = sections.setdefault("model", {})
    m |= {
        "tensor_model_parallel_size": par.tp,
        "pipeline_model_parallel_size": par.pp,
        "virtual_pipeline_model_parallel_size": par.vp if par.vp > 1 else None,
        "context_parallel_size": par.cp,
        "sequence_parallel": par.sequence_parallel,
        # MCore layout string ("E" embedding, "t" decoder, "L" loss, "|" stage); None = even split.
        "pipeline_model_parallel_layout": par.pipeline_layout or None,
    }
    if model.num_experts:
        m |= {"expert_model_parallel_size": par.ep, "expert_tensor_parallel_size": par.etp}
        if par.ep > 1:
            # HybridEP (the published backend) needs all EP ranks inside one NVLink domain (GB300 NVL72: 72).
            m["moe_token_dispatcher_type"] = "flex"
            m["moe_flex_dispatcher_backend"] = "hybridep" if par.ep <= hardware.nvlink_domain else "deepep"
        else:
            # No expert parallelism: nothing to dispatch across ranks. The base recipes' flex dispatcher would
            # need DeepEP / HybridEP installed for no benefit; Megatron's all-to-all dispatcher is a local permute.
            m["moe_token_dispatcher_type"] = "alltoall"
    sections.setdefault("train", {}).update(global_batch_size=par.gbs, micro_batch_size=par.mbs)


def apply_precision(sections: Sections, precision: PrecisionConfig) -> str:
    """The Bridge mixed-precision preset of `precision`.

    FP8 parameter gather is an A/B knob and is set by `apply_optimizer` (see `recipes.optimizers.ab_knobs`).
    """
    del sections  # the preset carries every precision field we change
    try:
        return PRECISION_PRESETS[precision.name]
    except KeyError:
        raise ValueError(f"precision.name={precision.name!r}: allowed {sorted(PRECISION_PRESETS)}") from None


def logger_fields(bench: BenchConfig, log_dir: str) -> dict[str, Any]:
    """Bridge's `LoggerConfig` fields of `bench.logger`: its own training log goes to the same sink as the bench's
    step metrics (`bench.sinks`), into `<log_dir>`: TensorBoard events under `tensorboard/bridge`, the W&B run's
    files, MLflow's `mlruns` unless MLFLOW_TRACKING_URI is set. No `log_dir` (a plan built outside a run): off."""
    import os

    if bench.logger == "none" or not log_dir:
        return {"tensorboard_dir": None}
    name = os.path.basename(os.path.normpath(log_dir))
    if bench.logger == "tensorboard":
        return {
            "tensorboard_dir": os.path.join(log_dir, "tensorboard", "bridge"),
            "log_throughput_to_tensorboard": True,
            "log_memory_to_tensorboard": True,
            "log_timers_to_tensorboard": True,
        }
    if bench.logger == "wandb":
        return {"tensorboard_dir": None, "wandb_project": bench.logger_project, "wandb_exp_name": name,
                "wandb_save_dir": log_dir}  # fmt: skip
    if bench.logger == "mlflow":
        uri = os.environ.get("MLFLOW_TRACKING_URI") or "file:" + os.path.join(os.path.abspath(log_dir), "mlruns")
        return {"tensorboard_dir": None, "mlflow_experiment": bench.logger_project, "mlflow_run_name": name,
                "mlflow_tracking_uri": uri}  # fmt: skip
    raise ValueError(f"bench.logger={bench.logger!r}: allowed ['none', 'tensorboard', 'wandb', 'mlflow']")


def benchmark_mode(
    sections: Sections, bench: BenchConfig, model: ModelConfig, *, log_dir: str = ""
) -> dict[str, Any]:
    """The benchmark policy (MB `_benchmark_common`): short run, every step logged, no checkpoint, no eval.

    `bench.steps` iterations (published: 50); LR warm-up over `bench.warmup_steps` (published: 10, the same steps
    the report skips) and decay over the run; Bridge's logger writes to `bench.logger` (`logger_fields`); mock data with a null tokenizer unless `bench.data` names an indexed
    dataset; NaN/large-gradient checks and fp32 gradient reduction off; rope and cross-entropy fusions on.
    """

    def put(section: str, **values: Any) -> None:
        sections.setdefault(section, {}).update(values)

    put("train", train_iters=bench.steps, manual_gc=True, manual_gc_interval=100)
    put("validation", eval_iters=0)
    put("scheduler", lr_warmup_iters=bench.warmup_steps, lr_decay_iters=bench.steps)
    put("checkpoint", save=None, load=None)
    put("logger", log_interval=bench.log_every, **logger_fields(bench, log_dir))
    put("ddp", check_for_nan_in_grad=False, check_for_large_grads=False, grad_reduce_in_fp32=False)
    put("mixed_precision", grad_reduce_in_fp32=False)
    put("rerun_state_machine", check_for_nan_in_loss=False)
    put("rng", seed=bench.seed)
    put("model", apply_rope_fusion=True, cross_entropy_fusion_impl="te")
    if sections["model"].get("moe_flex_dispatcher_backend") == "hybridep":
        put("model", moe_hybridep_num_sms=32)
    put("tokenizer", use_tokenizer_vocab_size=False)  # fixed model shape: no embedding/output resize
    put("dataset", random_seed=bench.seed)
    if bench.data == "mock":
        put("dataset", blend=None)  # Bridge's mock GPT dataset
        put("tokenizer", tokenizer_type="NullTokenizer", tokenizer_model=None, vocab_size=model.vocab_size)
    elif bench.data.startswith("indexed:"):
        put("dataset", blend=([bench.data.removeprefix("indexed:")], None))
    else:
        raise ValueError(
            f"bench.data={bench.data!r}: the bridge engine reads 'mock' or 'indexed:<path prefix>'"
        )
    return {
        "train_iters": bench.steps,
        "warmup_steps": bench.warmup_steps,
        "log_interval": bench.log_every,
        "data": bench.data,
    }


PROVIDERS: dict[str, str] = {"gqa": QWEN3_MOE.provider, "mla": KIMI_K2.provider}
"""`model.attention` -> the provider base class of a user recipe's model (the offline field check)."""


def user_recipe(dotted: str, model: ModelConfig) -> ModelRecipe:
    """A user's Bridge recipe (`engine.recipe`) as a `ModelRecipe`: no published per-model settings; `model`
    sets the shapes (a no-op when it describes the recipe's model, a slice with fewer layers)."""
    from recipes.user_recipe import split_recipe

    module, function = split_recipe(dotted)
    return ModelRecipe(
        family=model.family, base_recipe=f"{module}:{function}", provider=PROVIDERS[model.attention]
    )


def bridge_engine(root: RootConfig) -> BridgeEngineConfig:
    """The Bridge settings of `root`: its engine's under engine=bridge, the bridge engine's defaults for a plan of a
    config that runs on another engine (`python -m recipes`, the recipe comparisons)."""
    return root.engine if isinstance(root.engine, BridgeEngineConfig) else BridgeEngineConfig()


def ab_mode_of(root: RootConfig) -> str:
    """The A/B mode a config asks for (`engine.ab_mode`)."""
    return bridge_engine(root).ab_mode


def build_plan(root: RootConfig, *, ab_mode: str | None = None, log_dir: str = "") -> BridgePlan:
    """Compose the Bridge plan of one run from our typed config (`ab_mode` None: `ab_mode_of(root)`; `log_dir`: the
    run directory Bridge's logger writes into, see `logger_fields`)."""
    ab_mode = ab_mode or ab_mode_of(root)
    if ab_mode not in AB_MODES:
        raise ValueError(f"ab_mode={ab_mode!r}: allowed {list(AB_MODES)}")
    if bridge_engine(root).recipe:
        recipe = user_recipe(bridge_engine(root).recipe, root.model)
        sections = {"model": shape_fields(root.model), "dataset": {"seq_length": root.model.seq_length}}
    else:
        recipe = model_recipe(root.model)
        sections = base_sections(root.model)
    apply_parallelism(sections, root.parallelism, root.model, root.hardware)
    preset = apply_precision(sections, root.precision)
    opt_meta = apply_optimizer(
        sections, root.optimizer, root.parallelism.distribution, root.precision, ab_mode=ab_mode
    )
    bench_meta = benchmark_mode(sections, root.bench, root.model, log_dir=log_dir)
    metadata = {
        "recipe": recipe.family,
        "base_recipe": recipe.base_recipe,
        "precision_preset": preset,
        "ab_mode": ab_mode,
        **opt_meta,
        "benchmark": bench_meta,
    }
    return BridgePlan(
        base_recipe=recipe.base_recipe,
        provider=recipe.provider,
        precision_preset=preset,
        optimizer_impl=opt_meta["optimizer"]["bridge_impl"],
        overrides=sections,
        model_arg=recipe.base_recipe == AUTOBRIDGE_RECIPE,
        env_vars=dict(root.launcher.env),
        metadata=metadata,
    )


def build_overrides(root: RootConfig, *, ab_mode: str | None = None) -> Sections:
    """Section -> field -> value overrides of one run (see `build_plan`)."""
    return build_plan(root, ab_mode=ab_mode).overrides


def unknown_fields(plan: BridgePlan) -> list[str]:
    """`section.field` names of `plan` that the installed Megatron-Bridge does not define (read from source).

    Empty when every override names a real field. Reads the package source, imports no Bridge module.
    """
    from recipes.fields import dataclass_fields

    container = dataclass_fields(_CONFIG, "ConfigContainer")
    bad: list[str] = []
    for section, values in plan.overrides.items():
        if section not in container:
            bad.append(section)
            continue
        known = dataclass_fields(*plan.section_class(section))
        bad += [f"{section}.{name}" for name in values if name not in known]
    return bad


def preflight(root: RootConfig) -> None:
    """`bench.run`'s preflight of engine=bridge (`muonbench.engines`): the user's recipe (`engine.recipe`), the
    model's bridge and every override, as plain data; ValueError naming the field."""
    if root.engine.recipe:
        from recipes.user_recipe import check_recipe

        check_recipe(root.engine.recipe)
    build_plan(root)
