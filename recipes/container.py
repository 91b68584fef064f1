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

A recipe function named by dotted path (`engine.recipe`): `recipes.user_recipe`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from muonbench.schema import DistributionConfig, OptimizerSchemaBase, PrecisionConfig, optimizer_schemas
from recipes.user_recipe import require_container


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
    elif not isinstance(optimizer, tuple(optimizer_schemas().values())):
        raise ConfigError(
            f"optimizer={optimizer!r}: a conf/optimizer option name or a schema of "
            f"{sorted(optimizer_schemas())}"
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

    require_container(container, "container")
    opt, dist = optimizer_and_distribution(optimizer, distribution, **fields)
    sections: dict[str, dict[str, Any]] = {}
    meta = optimizer_sections(sections, opt, dist, container_precision(container), ab_mode=ab_mode)
    if not schedule:
        sections.pop("scheduler", None)
    bridge.apply_overrides(container, sections)
    if meta["optimizer"]["bridge_impl"] == "ours":
        container.optimizer = bridge._ours_optimizer_config(container.optimizer, opt, dist)
    return container
