"""Imports among our modules, read from the source (AST, nothing is imported): no import cycles, also through imports
inside functions, and an import inside a function only where it has to be there: a heavy or optional dependency
(torch, Megatron, Hydra, matplotlib, ...: directly, or one of our modules that imports one at its top), or an import
that would close a cycle at module level. Test files may import inside test functions (collection stays cheap).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("optim", "muonbench", "recipes", "bench", "experiments")
HEAVY = frozenset(
    {
        "apex", "cuda", "cutlass", "datasets", "emerging_optimizers", "hydra", "matplotlib", "megatron",
        "modelopt", "nemo", "numpy", "nvidia", "omegaconf", "pandas", "psutil", "pynvml", "quack", "safetensors",
        "scipy", "tensorboard", "torch", "tqdm", "transformer_engine", "transformers", "triton", "wandb", "yaml",
    }
)  # fmt: skip
"""Third-party packages worth importing late: slow to import, need a GPU stack, or optional extras."""


@dataclass(frozen=True)
class Import:
    module: str
    target: str
    line: int
    top: bool
    """At module level (not inside a function)."""


def _is_test_file(path: Path) -> bool:
    return path.name.startswith("test_") or path.name == "conftest.py"


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _walk(tree: ast.AST, *, type_checking: bool = False):
    """(import node, at module level) for every import, skipping `if TYPE_CHECKING:` blocks unless
    `type_checking`."""

    def rec(node: ast.AST, top: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test) and not type_checking:
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, top
            else:
                fn = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                yield from rec(child, top and not fn)

    yield from rec(tree, True)


@dataclass
class Graph:
    root: Path
    modules: dict[str, Path] = field(default_factory=dict)
    imports: list[Import] = field(default_factory=list)
    heavy_direct: set[str] = field(default_factory=set)
    """Our modules that import a HEAVY package at module level, or lazy packages (a module `__getattr__`)."""

    @classmethod
    def build(cls, root: Path = ROOT, *, type_checking: bool = False) -> Graph:
        g = cls(root)
        for pkg in PACKAGES:
            for p in sorted((root / pkg).rglob("*.py")):
                g.modules[_module_name(root, p)] = p
        for m, p in g.modules.items():
            tree = ast.parse(p.read_text(), filename=str(p))
            if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
                g.heavy_direct.add(m)
            for node, top in _walk(tree, type_checking=type_checking):
                for target in g._targets(m, node):
                    if target.split(".")[0] not in PACKAGES:
                        if top and target.split(".")[0] in HEAVY:
                            g.heavy_direct.add(m)
                        continue
                    while target and target not in g.modules:
                        target = target.rpartition(".")[0]
                    if target and target != m and not m.startswith(target + "."):  # not an enclosing package
                        g.imports.append(Import(m, target, node.lineno, top))
        return g

    def _targets(self, m: str, node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        mod = node.module or ""
        if node.level:
            base = m if self.modules[m].name == "__init__.py" else m.rpartition(".")[0]
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            mod = f"{base}.{mod}" if mod else base
        return [f"{mod}.{a.name}" if f"{mod}.{a.name}" in self.modules else mod for a in node.names]

    def edges(self, *, top_only: bool) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {m: set() for m in self.modules}
        for i in self.imports:
            if i.top or not top_only:
                out[i.module].add(i.target)
        return out

    @staticmethod
    def reach(adj: dict[str, set[str]], start: str) -> set[str]:
        seen, stack = set(), [start]
        while stack:
            for nxt in adj.get(stack.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    def heavy(self, m: str, adj: dict[str, set[str]] | None = None) -> bool:
        """Importing `m` (its enclosing packages run first) imports a heavy package."""
        adj = self.edges(top_only=True) if adj is None else adj
        parts = m.split(".")
        chain = {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & set(self.modules)
        return any(x in self.heavy_direct or self.reach(adj, x) & self.heavy_direct for x in chain)

    def cycles(self) -> list[list[str]]:
        """Strongly connected components of more than one module, function-level imports included (Tarjan)."""
        adj = self.edges(top_only=False)
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on: set[str] = set()
        out: list[list[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on.add(v)
            for w in adj[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

        for v in sorted(adj):
            if v not in index:
                visit(v)
        return out

    def misplaced(self) -> list[Import]:
        """Function-level imports of light modules of ours that would close no cycle at module level."""
        adj = self.edges(top_only=True)
        return [
            i
            for i in self.imports
            if not i.top
            and not _is_test_file(self.modules[i.module])
            and not self.heavy(i.target, adj)
            and i.module not in self.reach(adj, i.target) | {i.target}
        ]


def test_no_import_cycles_even_through_function_level_imports():
    """A cycle hidden in function-level imports still ties the modules together: shared pieces move down."""
    assert Graph.build().cycles() == []


def test_no_import_cycles_even_through_type_only_imports():
    """A module that imports a sibling only for an annotation still ties the two together: the interface one needs
    of the other is a Protocol in a module below both (optim/optimizers/protocols.py)."""
    assert Graph.build(type_checking=True).cycles() == []


def test_function_level_imports_only_for_heavy_dependencies_or_cycles():
    """Each listed import is of a light module of ours and could sit at the top of its file."""
    g = Graph.build()
    bad = [f"{g.modules[i.module].relative_to(ROOT)}:{i.line}: {i.target}" for i in g.misplaced()]
    assert bad == [], "\n".join(bad)


def test_the_import_graph_sees_what_it_should(tmp_path: Path):
    """On a small tree: a cycle through a function-level import, a misplaced light import, an allowed heavy one
    (direct and through one of ours), a relative import, and an import that would close a cycle at the top."""
    files = {
        "optim/__init__.py": "",
        "optim/a.py": "from optim import b\n",
        "optim/b.py": "def f():\n    from optim import a\n",
        "bench/__init__.py": "",
        "bench/light.py": "import json\n",
        "bench/gpu.py": "import torch\n",
        "bench/user.py": (
            "def f():\n    from bench import light\n\ndef g():\n    import torch\n    from bench import gpu\n"
            "\ndef h():\n    from .light import x\n"
        ),
        "bench/test_user.py": "def test():\n    from bench import light\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    g = Graph.build(tmp_path)
    assert g.cycles() == [["optim.a", "optim.b"]]
    assert g.heavy("bench.gpu") and not g.heavy("bench.light")
    # optim.b's import would close a cycle at the top: allowed; bench.user's two light imports are not
    assert sorted((i.module, i.line) for i in g.misplaced()) == [("bench.user", 2), ("bench.user", 9)]
