"""The package layering, read from the source (AST, no imports executed).

optim (the core) imports none of ours; muonbench (the config tree, leaf of the product) imports only optim; recipes
build on muonbench and optim, never on bench; bench's product path never imports its tools (bench/tools) or the
experiments; tools and experiments may import anything. The registries a login node reads import no torch at module
top. A violation names the file, the line and the import.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "optim": ("muonbench", "recipes", "bench", "experiments"),
    "muonbench": ("recipes", "bench", "experiments"),
    "recipes": ("bench", "experiments"),
    "bench": ("experiments",),
}
"""Package -> the packages of ours it must not import (dotted prefixes)."""
LOGIN_NODE = ("muonbench", "optim/registry.py", "optim/configs.py", "bench/metrics.py", "bench/engines/base.py")
"""Modules a login node imports to compose, check and tabulate: no torch at module top."""


def imports(path: Path, package: str, *, top_only: bool = False) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in `path`, a module of `package` (relative imports stay in it);
    `top_only`: module-level statements only (function-local imports are lazy)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_only else ast.walk(tree)
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this file's package
                out.append((node.lineno, package))
            elif node.module:
                out.append((node.lineno, node.module))
    return out


def _files(where: str) -> list[Path]:
    path = ROOT / where
    files = [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))
    assert files, f"{where} holds no Python file: the check would pass on nothing"
    return files


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def violations(package: str) -> list[str]:
    return [
        f"{p.relative_to(ROOT)}:{line}: imports {mod}"
        for p in _files(package)
        for line, mod in imports(p, package)
        if any(_under(mod, bad) for bad in FORBIDDEN[package])
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_downward(package: str) -> None:
    assert violations(package) == []


TOOLS_IN_PRODUCT = {"bench/memory.py: imports bench.tools.perfmodel.compute"}
"""Known imports of bench/tools from the product path, to move down (the memory prediction reads the performance
model's activation formula); each must still be one, so a fixed one is taken off this list."""


def test_bench_product_path_never_imports_its_tools() -> None:
    found = {
        f"{p.relative_to(ROOT)}: imports {mod}"
        for p in _files("bench")
        if "tools" not in p.relative_to(ROOT / "bench").parts
        for _, mod in imports(p, "bench")
        if _under(mod, "bench.tools")
    }
    assert found == TOOLS_IN_PRODUCT


def test_muonbench_imports_only_stdlib_hydra_optim_and_the_hf_config_reader() -> None:
    """muonbench is the leaf every other package reads: third-party imports other than Hydra's (omegaconf, PyYAML)
    and transformers' config reader for `model=hf:<spec>` are not allowed."""
    allowed = {"muonbench", "optim", "omegaconf", "hydra", "yaml", "transformers", "huggingface_hub", "__future__"}
    allowed |= set(sys.stdlib_module_names)
    found = {
        f"{p.relative_to(ROOT)}:{line}: imports {mod}"
        for p in _files("muonbench")
        for line, mod in imports(p, "muonbench")
        if mod.split(".")[0] not in allowed
    }
    assert found == set()


@pytest.mark.parametrize("where", LOGIN_NODE)
def test_login_node_modules_import_no_torch_at_top(where: str) -> None:
    found = [
        f"{p.relative_to(ROOT)}:{line}: imports {mod}"
        for p in _files(where)
        for line, mod in imports(p, where.split("/")[0], top_only=True)
        if mod.split(".")[0] in ("torch", "triton", "megatron", "transformers")
    ]
    assert found == []


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    """The AST reader finds plain, dotted, from-, relative and function-local imports (so an empty list means
    something), and tells module-level imports from function-local ones."""
    src = tmp_path / "m.py"
    src.write_text(
        "import bench.run\nfrom bench.tools import flops\nfrom . import x\n\ndef f():\n"
        "    from experiments.x import y\n"
    )
    assert sorted(imports(src, "recipes")) == [
        (1, "bench.run"), (2, "bench.tools"), (3, "recipes"), (6, "experiments.x")
    ]  # fmt: skip
    assert [m for _, m in imports(src, "recipes", top_only=True)] == ["bench.run", "bench.tools", "recipes"]
    assert _under("bench.tools.flops", "bench.tools") and not _under("benchmark", "bench")
