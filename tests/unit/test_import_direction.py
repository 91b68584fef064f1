"""The package layering, read from the source (AST, no imports executed).

optim (the core) imports none of ours; config (leaf of the product) imports only optim; recipes build on config and
optim, never on bench; bench (the product path) never imports tools or experiments; tools and experiments may
import anything. A violation names the file, the line and the import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("optim", "config", "recipes", "bench", "tools", "experiments")
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "optim": ("config", "recipes", "bench", "tools", "experiments"),
    "config": ("recipes", "bench", "tools", "experiments"),
    "recipes": ("bench", "tools", "experiments"),
    "bench": ("tools", "experiments"),
}


def imports(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in `path`, a module of `package` (relative imports stay in it)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this file's package
                out.append((node.lineno, package))
            elif node.module:
                out.append((node.lineno, node.module.split(".")[0]))
    return out


def violations(package: str) -> list[str]:
    bad = FORBIDDEN[package]
    return [
        f"{p.relative_to(ROOT)}:{line}: imports {mod}"
        for p in sorted((ROOT / package).rglob("*.py"))
        for line, mod in imports(p, package)
        if mod in bad
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_downward(package: str) -> None:
    assert violations(package) == []


def test_config_imports_only_stdlib_omegaconf_hydra_and_optim() -> None:
    """config/ is the leaf every other package reads: third-party imports other than Hydra's are not allowed."""
    import sys

    allowed = {"config", "optim", "omegaconf", "hydra", "__future__"} | set(sys.stdlib_module_names)
    found = {
        f"{p.relative_to(ROOT)}:{line}: imports {mod}"
        for p in sorted((ROOT / "config").rglob("*.py"))
        for line, mod in imports(p, "config")
        if mod not in allowed
    }
    assert found == set()


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    """The AST reader finds plain, dotted, from-, relative and function-local imports (so an empty list means
    something)."""
    src = tmp_path / "m.py"
    src.write_text(
        "import bench.run\nfrom tools import flops\nfrom . import x\n\ndef f():\n    from experiments.x import y\n"
    )
    assert sorted(imports(src, "recipes")) == [(1, "bench"), (2, "tools"), (3, "recipes"), (6, "experiments")]
