"""Our optimizer in a Megatron-Bridge ConfigContainer a user already has; a Bridge recipe function named by path.

    from megatron.bridge.recipes.llama import llama3_8b_pretrain_config
    from megatron.bridge.training.pretrain import pretrain
    from recipes import apply_optimizer

    cfg = apply_optimizer(llama3_8b_pretrain_config(), "muon", distribution={"tp_mode": "blockwise"})
    pretrain(cfg, forward_step)

`apply_optimizer` sets the same optimizer, scheduler and DDP fields the benchmark's own Bridge runs get
(`recipes.optimizers.apply_optimizer`, one home for that delta) and, for `implementation=ours`, replaces
`cfg.optimizer` by `recipes.bridge.OursOptimizerConfig`, whose `provide()` builds our optimizer (Bridge's duck-typed
optimizer seam). The model, parallel layout, data and precision of the container are left as the recipe made them.
docs/bridge_recipes.md shows the fields it sets.

`load_recipe("megatron.bridge.recipes.llama.llama3_8b_pretrain_config")` imports and calls a recipe function named
by dotted path (`engine.recipe` of the bridge engine); `check_recipe` checks the path before launch from the
installed source, without importing Bridge (which needs Transformer Engine).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any

from muonbench.schema import OPTIMIZER_SCHEMAS, DistributionConfig, OptimizerSchemaBase, PrecisionConfig

RECIPE_FIELD = "engine.recipe"
"""The config field that names a user's Bridge recipe function."""

CONTAINER_CLASS = ("megatron.bridge.training.config", "ConfigContainer")


def optimizer_and_distribution(
    optimizer: str | OptimizerSchemaBase,
    distribution: DistributionConfig | Mapping[str, Any] | None = None,
    **fields: Any,
) -> tuple[OptimizerSchemaBase, DistributionConfig]:
    """The typed optimizer config and distribution, composed and validated as `bench.run` does.

    `optimizer`: a `conf/optimizer/` option (muon, mop, soap_rekls, adamw, ...) with `fields` overriding its values
    (`num_ns_steps=6`), or a schema object used as it is. `distribution`: fields of `parallelism.distribution`
    (a mapping or a `DistributionConfig`; None: its defaults).

    Raises:
        muonbench.ConfigError: an unknown option or field, or a value outside its allowed set (named).
    """
    from muonbench import ConfigError, load

    overrides: list[str] = []
    if isinstance(optimizer, str):
        overrides += [f"optimizer={optimizer}", *(f"optimizer.{k}={_hydra(v)}" for k, v in fields.items())]
    elif fields:
        raise ConfigError(
            f"optimizer fields {sorted(fields)}: pass them with an optimizer name, not with a schema object"
        )
    elif not isinstance(optimizer, tuple(OPTIMIZER_SCHEMAS.values())):
        raise ConfigError(
            f"optimizer={optimizer!r}: a conf/optimizer option name or a schema of "
            f"{sorted(OPTIMIZER_SCHEMAS)}"
        )
    if isinstance(distribution, DistributionConfig):
        distribution = dataclasses.asdict(distribution)
    overrides += [f"parallelism.distribution.{k}={_hydra(v)}" for k, v in (distribution or {}).items()]
    root = load(overrides)
    return (root.optimizer if isinstance(optimizer, str) else optimizer), root.parallelism.distribution


def _hydra(value: Any) -> str:
    """A Python value as a Hydra override value."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra(v) for v in value) + "]"
    return str(value)


def container_precision(container: Any) -> PrecisionConfig:
    """The container's mixed precision as our `PrecisionConfig` (what the optimizer delta reads: FP8 recipe and
    FP8 parameter gather); a preset name or None counts as bf16."""
    mp = getattr(container, "mixed_precision", None)
    fp8_recipe = getattr(mp, "fp8_recipe", "") if getattr(mp, "fp8", None) else ""
    return PrecisionConfig(
        name="fp8_mx" if fp8_recipe == "mxfp8" else "bf16",
        fp8_recipe=fp8_recipe if fp8_recipe == "mxfp8" else "",
        fp8_param_gather=bool(getattr(mp, "fp8_param_gather", False)),
    )


def apply_optimizer(
    container: Any,
    optimizer: str | OptimizerSchemaBase = "muon",
    distribution: DistributionConfig | Mapping[str, Any] | None = None,
    *,
    schedule: bool = True,
    ab_mode: str = "published",
    **fields: Any,
) -> Any:
    """Put `optimizer` (Muon, MOP, SOAP-REKLS; AdamW for the baseline) into a Bridge `ConfigContainer`; returns it.

    Sets the optimizer section (LR, weight decay, clip, scalar AdamW; Megatron's `dist_muon` for
    `implementation=megatron`), the DDP fields the layer-wise path needs (no Megatron distributed optimizer for
    ours; its own gradient reduce-scatter, so no overlapped DDP reduction) and, with `schedule`, the scheduler's
    warm-up, decay style and weight decay. `implementation=ours`: `cfg.optimizer` becomes an
    `OursOptimizerConfig` whose `provide()` builds our optimizer distributed as `distribution`
    (`parallelism.distribution`: TP mode, layer-wise or replicated). Arguments as `optimizer_and_distribution`.

    Raises:
        ValueError: `container` is not a ConfigContainer, a field the installed Bridge lacks, or a setting the
            chosen implementation cannot run (each names the field and value).
    """
    from recipes import bridge
    from recipes.optimizers import apply_optimizer as optimizer_sections

    _require_container(container, "container")
    opt, dist = optimizer_and_distribution(optimizer, distribution, **fields)
    sections: dict[str, dict[str, Any]] = {}
    meta = optimizer_sections(sections, opt, dist, container_precision(container), ab_mode=ab_mode)
    if not schedule:
        sections.pop("scheduler", None)
    bridge.apply_overrides(container, sections)
    if meta["optimizer"]["bridge_impl"] == "ours":
        container.optimizer = bridge._ours_optimizer_config(container.optimizer, opt, dist)
    return container


def _require_container(obj: Any, what: str) -> None:
    cls = getattr(importlib.import_module(CONTAINER_CLASS[0]), CONTAINER_CLASS[1])
    if not isinstance(obj, cls):
        kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
        raise ValueError(f"{what}: {kind}, not a Bridge ConfigContainer")


def split_recipe(dotted: str) -> tuple[str, str]:
    """(module, function) of `pkg.module.function` or `pkg.module:function`.

    Raises:
        ValueError: not a dotted path with a module and a function name (names `engine.recipe`).
    """
    module, sep, name = dotted.partition(":") if ":" in dotted else dotted.rpartition(".")
    parts = [*module.split("."), name]
    if not sep or not all(p.isidentifier() for p in parts):
        raise ValueError(
            f"{RECIPE_FIELD}={dotted!r}: a recipe function by dotted path, "
            "e.g. megatron.bridge.recipes.llama.llama3_8b_pretrain_config"
        )
    return module, name


def check_recipe(dotted: str) -> tuple[str, str]:
    """Check before launch that `dotted` names a function of an installed module; returns (module, function).

    Bridge modules are read from source (`recipes.fields`; importing Bridge needs Transformer Engine), others are
    imported. Whether the function returns a ConfigContainer is checked when it is called (`load_recipe`).

    Raises:
        ValueError: malformed path, module not installed, or no such function in it (names `engine.recipe`).
    """
    from recipes.fields import BRIDGE_PKG, bridge_version, function_defined

    module, name = split_recipe(dotted)
    where = f"{RECIPE_FIELD}={dotted!r}"
    if module.startswith(BRIDGE_PKG) and bridge_version() is not None:
        try:
            found = function_defined(module, name)
        except ValueError:
            raise ValueError(f"{where}: no module {module!r} in megatron-bridge {bridge_version()}") from None
    else:
        try:
            found = importlib.util.find_spec(module) is not None and callable(
                getattr(importlib.import_module(module), name, None)
            )
        except ImportError as exc:
            raise ValueError(f"{where}: module {module!r} does not import ({exc})") from None
    if not found:
        raise ValueError(f"{where}: module {module!r} defines no function {name!r}")
    return module, name


def load_recipe(dotted: str) -> Any:
    """Import the recipe function named by `dotted`, call it without arguments and return its ConfigContainer.

    Raises:
        ValueError: as `check_recipe`, or the attribute is not callable, or it returns something else than a
            ConfigContainer (names `engine.recipe` and the value).
    """
    module, name = split_recipe(dotted)
    where = f"{RECIPE_FIELD}={dotted!r}"
    try:
        fn = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ValueError(f"{where}: module {module!r} does not import ({exc})") from None
    except AttributeError:
        raise ValueError(f"{where}: module {module!r} has no attribute {name!r}") from None
    if not callable(fn):
        raise ValueError(f"{where}: {type(fn).__name__} is not callable")
    cfg = fn()
    _require_container(cfg, f"{where} returned")
    return cfg
