"""Dataclass field names of Megatron-Bridge configs, read from the installed package SOURCE (no import).

Megatron-Bridge imports Transformer Engine at module top, so outside the NeMo container it cannot be imported. Its
config dataclasses can still be read: this module parses the source with `ast`, collects the annotated fields of a
`@dataclass` class and follows its base classes. Bases from Megatron-Core and `megatron.training` are parsed the
same way, from their source on `sys.path`: importing them pulls in Megatron-Core's whole package (Transformer
Engine shims, torch.compile'd fusions) and `megatron.training`'s checkpointing stack (modelopt, transformers,
wandb), many seconds on a login node for a few field names. A base from any other package is imported and
read with `dataclasses.fields`.

Used by the offline tests (a renamed Bridge field fails them) and by `recipes.overrides.unknown_fields`, which a login
node can run before submitting a job.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import sys
from importlib import metadata
from pathlib import Path

BRIDGE_DIST = "megatron-bridge"
BRIDGE_PKG = "megatron.bridge"
SOURCE_PKGS = (BRIDGE_PKG, "megatron.core", "megatron.training")
"""Packages whose dataclasses are read from source, never imported."""


def bridge_version() -> str | None:
    """Installed Megatron-Bridge version, or None when the distribution is absent."""
    try:
        return metadata.version(BRIDGE_DIST)
    except metadata.PackageNotFoundError:
        return None


def _module_path(module: str) -> Path:
    """Source file of a `megatron.bridge.*` module, located through the distribution, or of another SOURCE_PKGS
    module, found on `sys.path` (nothing is imported: a parent package's `__init__` would run)."""
    rel = Path(*module.split("."))
    if not module.startswith(BRIDGE_PKG):
        for entry in sys.path:
            for candidate in (rel.with_suffix(".py"), rel / "__init__.py"):
                if (path := Path(entry or ".") / candidate).is_file():
                    return path
        raise ValueError(f"module {module!r} not found on sys.path")
    dist = metadata.distribution(BRIDGE_DIST)
    for candidate in (rel.with_suffix(".py"), rel / "__init__.py"):
        path = Path(str(dist.locate_file(candidate)))
        if path.is_file():
            return path
    raise ValueError(f"module {module!r} not found in the installed {BRIDGE_DIST} {bridge_version()}")


@functools.cache
def _parse(module: str) -> ast.Module:
    return ast.parse(_module_path(module).read_text(encoding="utf-8"), filename=str(_module_path(module)))


def _imports(tree: ast.Module, module: str) -> dict[str, tuple[str, str | None]]:
    """Local name -> (module, attribute) for the module's top-level imports (attribute None for `import x`)."""
    out: dict[str, tuple[str, str | None]] = {}
    package = module.rsplit(".", 1)[0]
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            src = node.module or ""
            if node.level:  # relative import
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                src = ".".join(base + ([src] if src else []))
            for alias in node.names:
                out[alias.asname or alias.name] = (src, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                out[alias.asname or alias.name.split(".")[0]] = (alias.name, None)
    return out


def _is_dataclass_decorator(dec: ast.expr) -> bool:
    target = dec.func if isinstance(dec, ast.Call) else dec
    return (isinstance(target, ast.Name) and target.id == "dataclass") or (
        isinstance(target, ast.Attribute) and target.attr == "dataclass"
    )


def _is_classvar(annotation: ast.expr) -> bool:
    node = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    return (isinstance(node, ast.Name) and node.id == "ClassVar") or (
        isinstance(node, ast.Attribute) and node.attr == "ClassVar"
    )


def _base_ref(base: ast.expr) -> str | None:
    """Dotted name of a base-class expression (`Generic[T]` -> `Generic`)."""
    if isinstance(base, ast.Subscript):
        base = base.value
    parts: list[str] = []
    while isinstance(base, ast.Attribute):
        parts.append(base.attr)
        base = base.value
    if isinstance(base, ast.Name):
        return ".".join([base.id, *reversed(parts)])
    return None


@functools.cache
def dataclass_fields(module: str, name: str) -> frozenset[str]:
    """All dataclass field names of class `name` as seen from `module` (own fields plus every base's).

    `name` may be defined in `module` or imported into it. SOURCE_PKGS modules are parsed; others are imported.

    Raises:
        ValueError: the class is not found.
    """
    if not module.startswith(SOURCE_PKGS):
        cls = getattr(importlib.import_module(module), name)
        return (
            frozenset(f.name for f in dataclasses.fields(cls))
            if dataclasses.is_dataclass(cls)
            else frozenset()
        )
    tree = _parse(module)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return _class_fields(node, tree, module)
    imported = _imports(tree, _anchor(module)).get(name)
    if imported is None or imported[1] is None:
        raise ValueError(f"class {name!r} is neither defined nor imported in {module}")
    return dataclass_fields(imported[0], imported[1])


def _anchor(module: str) -> str:
    """The name relative imports resolve against: a package's `__init__` resolves them against itself."""
    return f"{module}.__init__" if _module_path(module).name == "__init__.py" else module


def _class_fields(node: ast.ClassDef, tree: ast.Module, module: str) -> frozenset[str]:
    names: set[str] = set()
    imports = _imports(tree, _anchor(module))
    local = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    for base in node.bases:
        ref = _base_ref(base)
        if ref is None or ref in {"Generic", "Protocol", "ABC", "object"}:
            continue
        head, _, rest = ref.partition(".")
        if head in local and not rest:
            names |= dataclass_fields(module, head)
        elif head in imports:
            src, attr = imports[head]
            if attr is None:  # `import pkg` then `pkg.mod.Class`
                mod, _, cls = f"{src}.{rest}".rpartition(".")
                names |= dataclass_fields(mod, cls)
            elif rest:
                names |= dataclass_fields(f"{src}.{attr}", rest)
            else:
                names |= dataclass_fields(src, attr)
    if any(_is_dataclass_decorator(d) for d in node.decorator_list):
        for stmt in node.body:
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and not _is_classvar(stmt.annotation)
            ):
                names.add(stmt.target.id)
    return frozenset(names)


def function_defined(module: str, name: str) -> bool:
    """Whether a top-level function `name` is defined or imported in a Bridge module (source only)."""
    tree = _parse(module)
    if any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body):
        return True
    return name in _imports(tree, module)


def function_returns(module: str, name: str) -> str | None:
    """The return annotation of top-level function `name` of a Bridge module as source text (imports followed
    within Bridge), or None when it has none or is not found there (source only)."""
    tree = _parse(module)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.unparse(node.returns) if node.returns is not None else None
    src, attr = _imports(tree, _anchor(module)).get(name, ("", None))
    return function_returns(src, attr) if attr is not None and src.startswith(BRIDGE_PKG) else None
