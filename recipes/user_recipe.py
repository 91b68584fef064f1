"""A user's Megatron-Bridge recipe function named by dotted path (`engine.recipe` of the bridge engine).

`load_recipe("megatron.bridge.recipes.llama.llama3_8b_pretrain_config")` imports and calls it; `check_recipe` checks
the path before launch from the installed source, without importing Bridge (which needs Transformer Engine).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from recipes.fields import BRIDGE_PKG, bridge_version, function_defined

RECIPE_FIELD = "engine.recipe"
"""The config field that names a user's Bridge recipe function."""

CONTAINER_CLASS = ("megatron.bridge.training.config", "ConfigContainer")


def require_container(obj: Any, what: str) -> None:
    """Raise ValueError naming `what` unless `obj` is a Bridge ConfigContainer."""
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
    require_container(cfg, f"{where} returned")
    return cfg
