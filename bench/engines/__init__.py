"""The runtime side of the engine registry (`muonbench.engines.ENGINES`): engines are imported lazily by name, so a
missing one fails with a clear message only when used."""

from __future__ import annotations

import importlib

from bench.engines.base import Engine, RankInfo, StepMetrics
from muonbench.engines import ENGINES

__all__ = ["Engine", "RankInfo", "StepMetrics", "check_engine_present", "engine_class"]


def _where(name: str) -> tuple[str, str]:
    """(module, class) of the registered engine `name`; ValueError naming the choices."""
    if name not in ENGINES:
        raise ValueError(f"engine.name={name!r}: unknown engine; available: {sorted(ENGINES)}")
    module, _, cls = ENGINES[name].engine.partition(":")
    return module, cls


def check_engine_present(name: str) -> None:
    """Cheap pre-launch check (no import): the engine is registered and its module file exists in this checkout."""
    import importlib.util

    module, _ = _where(name)
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"engine.name={name!r}: {module} is not in this checkout")


def engine_class(name: str) -> type[Engine]:
    """The `Engine` subclass registered as `name`; ValueError naming the choices or the import failure."""
    module_name, cls_name = _where(name)
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
