"""A user's Megatron-Bridge recipe function named by dotted path (`engine.recipe` of the bridge engine).

`load_recipe("megatron.bridge.recipes.llama.llama3_8b_pretrain_config")` imports and calls it; `check_recipe` checks
the path and the return type before launch, a Bridge module from the installed source without importing Bridge
(which needs Transformer Engine).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from typing import Any

from recipes.fields import BRIDGE_PKG, bridge_version, function_defined, function_returns

RECIPE_FIELD = "engine.recipe"
"""The config field that names a user's Bridge recipe function."""

CONTAINER_CLASS = ("megatron.bridge.training.config", "ConfigContainer")


def require_container(obj: Any, what: str) -> None:
    """Raise ValueError naming `what` unless `obj` is a Bridge ConfigContainer."""
    cls = getattr(importlib.import_module(CONTAINER_CLASS[0]), CONTAINER_CLASS[1])
    if not isinstance(obj, cls):
        kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
        raise ValueError(f"{what}: {kind}, not a Bridge ConfigContainer")  # noqa: TRY004 - a user error: CLIs print ValueError


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


def _returns_container(annotation: object) -> bool:
    """A return annotation (class or source text) that names Bridge's ConfigContainer."""
    text = annotation if isinstance(annotation, str) else f"{annotation.__module__}.{annotation.__qualname__}"
    return text.rpartition(".")[2].strip("'\"") == CONTAINER_CLASS[1]


def check_recipe(dotted: str) -> tuple[str, str]:
    """Check before launch that `dotted` names a function of an installed module that returns a ConfigContainer;
    returns (module, function).

    Bridge modules are read from source (`recipes.fields`; importing Bridge needs Transformer Engine): the function's
    return annotation must name ConfigContainer. Other modules are imported: an annotated function must name it; an
    unannotated one is called and its value checked, where Bridge imports (elsewhere `load_recipe` checks it on the
    rank).

    Raises:
        ValueError: malformed path, module not installed, no such function in it, or a return type other than
            ConfigContainer (names `engine.recipe` and its value).
    """
    module, name = split_recipe(dotted)
    where = f"{RECIPE_FIELD}={dotted!r}"
    if module.startswith(BRIDGE_PKG) and bridge_version() is not None:
        try:
            found = function_defined(module, name)
        except ValueError:
            raise ValueError(f"{where}: no module {module!r} in megatron-bridge {bridge_version()}") from None
        returns = function_returns(module, name) if found else None
        if returns is not None and not _returns_container(returns):
            raise ValueError(f"{where}: returns {returns}, not a Bridge ConfigContainer")
    else:
        try:
            fn = getattr(importlib.import_module(module), name, None) if importlib.util.find_spec(module) else None
        except ImportError as exc:
            raise ValueError(f"{where}: module {module!r} does not import ({exc})") from None
        found = callable(fn)
        if found and (inspect.isbuiltin(fn) or inspect.isclass(fn)):
            raise ValueError(f"{where}: a {type(fn).__name__}, not a function returning a Bridge ConfigContainer")
        if found:
            _check_returns(fn, where)
    if not found:
        raise ValueError(f"{where}: module {module!r} defines no function {name!r}")
    return module, name


def _check_returns(fn: object, where: str) -> None:
    """An imported recipe function: its return annotation, or without one its value (where Bridge imports)."""
    try:
        returns = inspect.signature(fn).return_annotation  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a builtin without a signature: its value tells
        returns = inspect.Signature.empty
    if returns is not inspect.Signature.empty:
        if not _returns_container(returns):
            shown = returns if isinstance(returns, str) else f"{returns.__module__}.{returns.__qualname__}"
            raise ValueError(f"{where}: returns {shown}, not a Bridge ConfigContainer")
        return
    try:
        importlib.import_module(CONTAINER_CLASS[0])
    except ImportError:
        return
    require_container(fn(), f"{where} returned")  # type: ignore[operator]


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
        raise ValueError(f"{where}: {type(fn).__name__} is not callable")  # noqa: TRY004 - a user error, as above
    cfg = fn()
    require_container(cfg, f"{where} returned")
    return cfg
