"""Apply a `BridgePlan` onto a live Megatron-Bridge ConfigContainer (NeMo container only; imports are lazy).

    container, plan = build_config_container(root)          # root: muonbench.schema.RootConfig
    pretrain(container, forward_step, callbacks=[...])

Steps: import the model's Bridge recipe and call it; swap in the mixed-precision preset; set every override,
refusing a field the live Bridge does not have (a rename since the version the offline tests read is an error, not
a silent no-op; `LEGACY_FIELDS` maps the few documented renames of older Bridge / Megatron-Core releases); for
`optimizer.implementation=ours`, replace the optimizer config by a subclass whose `provide()` builds our optimizer
through `optim.megatron.build_ours` (Bridge's duck-typed optimizer seam, MB PR #2132).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
from typing import Any

from muonbench.schema import (
    DistributionConfig,
    RootConfig,
    layerwise_fields,
    optim_configs,
    optimizer_schemas,
)
from recipes.overrides import FAIR_MIN_MCORE, BridgePlan, ab_mode_of, bridge_engine, build_plan

REQUIRED_MODULES = ("megatron.bridge", "megatron.core", "transformer_engine")
CHECKED_BRIDGE_VERSION = "0.6.2"
"""The Megatron-Bridge release whose source the offline tests check every override against."""

LEGACY_FIELDS: dict[tuple[str, str], str] = {
    # Megatron-Core <= 0.17 (NeMo 26.02 ships r0.16) called it muon_use_nesterov.
    ("optimizer", "muon_nesterov"): "muon_use_nesterov",
}
"""(section, field) -> the same field's name in older releases, used only when the current name is absent."""

OPTIONAL_SECTIONS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "comm_overlap": (
        "megatron.bridge.training.comm_overlap",
        "CommOverlapConfig",
        {"tp_comm_overlap": False},
    ),
}
"""Sections a base recipe may leave None: (module, class, constructor kwargs) to create them before overriding."""


def missing_modules() -> list[str]:
    """The modules of `REQUIRED_MODULES` that are not importable here (found without importing them)."""
    return [name for name in REQUIRED_MODULES if not _importable(name)]


def require_bridge() -> None:
    """Raise a ValueError naming what is missing when Megatron-Bridge cannot run here."""
    missing = missing_modules()
    if missing:
        raise ValueError(
            f"engine=bridge needs {', '.join(missing)}, which this Python cannot import. Megatron-Bridge runs where "
            "Transformer Engine is installed: the NeMo container (docker build . -> FROM nvcr.io/nvidia/nemo:26.02; "
            "`make bench-cluster` submits into it). Here, `recipes.overrides.build_plan` still shows what would run."
        )


def _import(dotted: str) -> Any:
    module, _, attr = dotted.partition(":")
    return getattr(importlib.import_module(module), attr)


def _field_names(obj: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(obj)}


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def apply_overrides(cfg: Any, overrides: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Set `section.field = value` on `cfg`; returns the legacy renames used ({"section.field": "old name"}).

    Raises:
        ValueError: a section or field that the live ConfigContainer does not have (and no legacy name matches).
    """
    renamed: dict[str, str] = {}
    for section, values in overrides.items():
        target = getattr(cfg, section, None)
        if target is None and section in OPTIONAL_SECTIONS:
            module, cls, kwargs = OPTIONAL_SECTIONS[section]
            target = getattr(importlib.import_module(module), cls)(**kwargs)
            setattr(cfg, section, target)
        if target is None or not dataclasses.is_dataclass(target):
            raise ValueError(
                f"override section {section!r}: the ConfigContainer has no dataclass there ({target!r})"
            )
        known = _field_names(target)
        for name, value in values.items():
            field_name = name
            if name not in known:
                legacy = LEGACY_FIELDS.get((section, name))
                if legacy is None or legacy not in known:
                    raise ValueError(
                        f"override {section}.{name}={value!r}: {type(target).__name__} of the installed "
                        f"Megatron-Bridge has no such field (the offline tests checked release "
                        f"{CHECKED_BRIDGE_VERSION}); update recipes/ for this release"
                    )
                field_name = renamed[f"{section}.{name}"] = legacy
            setattr(target, field_name, value)
    return renamed


@functools.cache
def _ours_optimizer_class() -> type:
    """Bridge's OptimizerConfig plus `provide()`, which builds our optimizer (matrices) + fused AdamW (the rest).

    Created on first use (Bridge imports Transformer Engine) and reachable as `recipes.bridge.OursOptimizerConfig`
    (module `__getattr__`), so Bridge can print, copy and pickle a config holding it. Bridge's weight-decay
    `config_overrides` are not used: our routing decides which parameters decay.
    """
    from megatron.bridge.training.config import OptimizerConfig

    @dataclasses.dataclass
    class OursOptimizerConfig(OptimizerConfig):
        muonbench_optimizer: dict[str, Any] = dataclasses.field(default_factory=dict)
        """Our optimizer schema as a plain dict (keeps the config printable)."""
        muonbench_distribution: dict[str, Any] = dataclasses.field(default_factory=dict)
        """`parallelism.distribution` as a plain dict (TP mode, layer-wise or replicated)."""

        def provide(
            self,
            model_chunks: Any,
            config_overrides: Any = None,
            use_gloo_process_groups: bool = False,
            pg_collection: Any = None,
        ) -> Any:
            del config_overrides, use_gloo_process_groups, pg_collection
            from optim.distributed.layerwise import LayerWiseConfig
            from optim.megatron import build_ours

            opt = optimizer_schemas()[self.muonbench_optimizer["name"]](**self.muonbench_optimizer)
            distribution = DistributionConfig(**self.muonbench_distribution)
            algo, routing, adamw = optim_configs(opt)
            chunks = model_chunks if isinstance(model_chunks, list) else [model_chunks]
            optimizer, _ = build_ours(
                chunks,
                algo,
                adamw,
                routing,
                clip_grad=self.clip_grad,
                tp_mode=distribution.tp_mode,
                layerwise=distribution.distributed == "layerwise",
                layerwise_config=LayerWiseConfig(**layerwise_fields(distribution)),
                bf16=self.bf16,  # set from the mixed-precision config by Bridge's runtime config update
            )
            decay_to_min_lr(optimizer, self.min_lr)
            return optimizer

    OursOptimizerConfig.__module__ = __name__
    OursOptimizerConfig.__qualname__ = "OursOptimizerConfig"
    return OursOptimizerConfig


def __getattr__(name: str) -> Any:
    if name == "OursOptimizerConfig":
        return _ours_optimizer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def decay_to_min_lr(optimizer: Any, min_lr: float) -> None:
    """Set every param group's `min_lr` to Bridge's `optimizer.min_lr`, as Megatron's own optimizer factory does.

    Bridge's scheduler (Megatron's OptimizerParamScheduler) decays each group from its `max_lr` to its `min_lr`;
    `optim.megatron.megatron_group` sets `min_lr = max_lr` (constant after warm-up), which would keep ours at the
    peak LR while Bridge's AdamW and Muon decay to `min_lr`.
    """
    for group in optimizer.param_groups:
        group["min_lr"] = min_lr


def _ours_optimizer_config(base: Any, schema_obj: Any, distribution: DistributionConfig) -> Any:
    """`base` (the applied Bridge OptimizerConfig) turned into an `OursOptimizerConfig` for `schema_obj`, distributed
    as `distribution` (`parallelism.distribution`)."""
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}
    return _ours_optimizer_class()(
        **values,
        muonbench_optimizer=dataclasses.asdict(schema_obj),
        muonbench_distribution=dataclasses.asdict(distribution),
    )


APEX_FUSED_WGRAD = "fused_weight_gradient_mlp_cuda"
"""APEX's CUDA extension that Megatron-Core's gradient-accumulation fusion needs outside Transformer Engine layers."""


def adapt_to_node(cfg: Any) -> dict[str, Any]:
    """Settings of the built ConfigContainer that this node cannot run, turned off; returns what changed.

    `model.gradient_accumulation_fusion` (on in Bridge's recipes) needs APEX's `fused_weight_gradient_mlp_cuda`,
    which the NeMo container has and a pip install lacks: Megatron-Core raises at model build. Off, the weight
    gradients are accumulated by a separate add (slower); the change goes into the run record.
    """
    changed: dict[str, Any] = {}
    if getattr(cfg.model, "gradient_accumulation_fusion", False) and not _importable(APEX_FUSED_WGRAD):
        cfg.model.gradient_accumulation_fusion = False
        changed["model.gradient_accumulation_fusion"] = {
            "recipe": True,
            "used": False,
            "why": f"APEX extension {APEX_FUSED_WGRAD} not installed on this node",
        }
    return changed


def _importable(name: str) -> bool:
    """Whether `name` can be imported here (found without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def build_config_container(
    root: RootConfig, *, ab_mode: str | None = None, hf_dir: Any = None
) -> tuple[Any, BridgePlan]:
    """The Megatron-Bridge ConfigContainer of one run, and the plan it was built from.

    `hf_dir`: where the model's Hugging Face config is written for the recipe to read offline
    (`recipes.hf_config.offline_hub`); None: a temporary directory.

    Raises:
        ValueError: Megatron-Bridge is not importable, a field is unknown, or the installed Megatron-Core is too
            old for the requested A/B mode.
    """
    require_bridge()
    return make_config_container(root, ab_mode=ab_mode, hf_dir=hf_dir)


def make_config_container(
    root: RootConfig, *, ab_mode: str | None = None, hf_dir: Any = None, log_dir: str = ""
) -> tuple[Any, BridgePlan]:
    """`build_config_container` without the check that this node can run Bridge (Transformer Engine); `log_dir`:
    the run directory of Bridge's logger (`recipes.overrides.logger_fields`)."""
    plan = build_plan(root, ab_mode=ab_mode or ab_mode_of(root), log_dir=log_dir)
    import tempfile

    from recipes.hf_config import offline_hub

    if not bridge_engine(root).recipe and not plan.model_arg:  # a user's recipe reads its own Hub config (node's cache)
        plan.metadata["hf_offline"] = offline_hub(
            root.model, hf_dir or tempfile.mkdtemp(prefix="muonbench_hf_")
        )
    import megatron.core
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    need = plan.metadata["requires"].get("megatron-core")
    if need and _version_tuple(megatron.core.__version__) < FAIR_MIN_MCORE:
        raise ValueError(
            f"ab_mode={plan.metadata['ab_mode']!r} with {root.optimizer.name} (implementation=megatron) needs "
            f"megatron-core {need}; installed {megatron.core.__version__}. Use ab_mode=published or build the image "
            "with a newer Megatron-Core (Dockerfile ARG MCORE_VERSION)."
        )
    if bridge_engine(root).recipe:
        from recipes.user_recipe import load_recipe

        cfg = load_recipe(bridge_engine(root).recipe)
        plan.metadata["user_recipe"] = bridge_engine(root).recipe
    elif plan.model_arg:
        cfg = _import(plan.base_recipe)(root.model)
        plan.metadata["hf_config"] = root.model.source
    else:
        cfg = _import(plan.base_recipe)()
    cfg.mixed_precision = get_mixed_precision_config(plan.precision_preset)
    renamed = apply_overrides(cfg, plan.overrides)
    if plan.optimizer_impl == "ours":
        cfg.optimizer = _ours_optimizer_config(cfg.optimizer, root.optimizer, root.parallelism.distribution)
    cfg.env_vars = {**cfg.env_vars, **plan.env_vars}
    plan.metadata["legacy_fields"] = renamed
    plan.metadata["node_adjustments"] = adapt_to_node(cfg)
    plan.metadata["benchmark"].update(capture_in_warmup(cfg, root.bench.warmup_steps))
    return cfg, plan


def capture_in_warmup(cfg: Any, warmup_steps: int) -> dict[str, Any]:
    """Keep Transformer Engine's CUDA-graph capture out of the timed steps; returns what changed.

    Bridge's loop captures the graphs during the iteration after `model.cuda_graph_warmup_steps` iterations (3 in
    its recipes); the bench times every step after `bench.warmup_steps`. With fewer warm-up steps than that, the
    capture is moved to the last warm-up step. The capture needs one eager step before it.

    Raises:
        ValueError: CUDA graphs are on and `warmup_steps` < 2.
    """
    if getattr(cfg.model, "cuda_graph_impl", "none") != "transformer_engine":
        return {}
    recipe = cfg.model.cuda_graph_warmup_steps
    if warmup_steps > recipe:
        return {}
    if warmup_steps < 2:
        raise ValueError(
            f"bench.warmup_steps={warmup_steps}: this recipe captures Transformer Engine CUDA graphs "
            f"(model.cuda_graph_impl=transformer_engine) after at least one eager step, and the capture must fall "
            "in a warm-up step; use bench.warmup_steps >= 2"
        )
    cfg.model.cuda_graph_warmup_steps = warmup_steps - 1
    return {"cuda_graph_warmup_steps": {"recipe": recipe, "used": warmup_steps - 1}}
