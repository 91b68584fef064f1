"""Engine registry: engines are imported lazily by name, so a missing one fails with a clear message only when used."""

from __future__ import annotations

import importlib

from bench.engines.base import Engine, RankInfo, StepMetrics

__all__ = ["ENGINES", "Engine", "RankInfo", "StepMetrics", "check_engine_present", "engine_class"]

ENGINES: dict[str, tuple[str, str]] = {
    "hf": ("bench.engines.hf", "HFEngine"),
    "megatron": ("bench.engines.megatron", "MegatronEngine"),
    "bridge": ("bench.engines.bridge", "BridgeEngine"),
}
"""engine.name -> (module, class)."""


def check_engine_present(name: str) -> None:
    """Cheap pre-launch check (no import): the engine is registered and its module file exists in this checkout."""
    import importlib.util

    if name not in ENGINES:
        raise ValueError(f"engine.name={name!r}: unknown engine; available: {sorted(ENGINES)}")
    if importlib.util.find_spec(ENGINES[name][0]) is None:
        raise ValueError(f"engine.name={name!r}: {ENGINES[name][0]} is not in this checkout")


def engine_class(name: str) -> type[Engine]:
    """The `Engine` subclass registered as `name`; ValueError naming the choices or the import failure."""
    if name not in ENGINES:
        raise ValueError(f"engine.name={name!r}: unknown engine; available: {sorted(ENGINES)}")
    module_name, cls_name = ENGINES[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or "?"
        if missing == module_name:
            raise ValueError(f"engine.name={name!r}: {module_name} is not in this checkout yet") from exc
        raise ValueError(
            f"engine.name={name!r} is unavailable here: it needs the package {missing!r} ({exc})"
        ) from exc
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise ValueError(f"engine.name={name!r}: {module_name} defines no class {cls_name}")
    return cls
