"""The package's import graph, read from the source (AST): no import circle, no private name across modules.

Every ``import dartree.x`` / ``from dartree.x import y`` counts, at module level, inside a function (a
function-level import that closes a circle still ties the two modules together) or under
``if TYPE_CHECKING:`` (annotations that name a module above still make the layers point both ways).
Subpackages form layers too: no circle among ``dartree.verify``, ``dartree.fast``, ``dartree.models``, ...
A compiled extension module (``dartree._native``, imported by its wrapper ``dartree.native``) and dunder
names are not private names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dartree

ROOT = Path(dartree.__file__).parent


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """Module -> imported dartree modules; and every (importer, module, private name) imported."""
    files = {_module(p): p for p in ROOT.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in files}
    private: list[tuple[str, str, str]] = []
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(node, module, path.name == "__init__.py")
                if not source.startswith("dartree"):
                    continue
                targets = []
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    if sub in files:                   # ``from dartree.x import submodule``
                        targets.append(sub)
                    else:
                        targets.append(source)
                        folder = ROOT.parent.joinpath(*source.split("."))
                        compiled = (folder / f"{alias.name}.c").is_file() or any(folder.glob(f"{alias.name}.*.so"))
                        dunder = alias.name.startswith("__") and alias.name.endswith("__")
                        if alias.name.startswith("_") and source != module and not (compiled or dunder):
                            private.append((module, source, alias.name))
            else:
                continue
            for t in targets:
                while t and t not in files:            # ``import dartree.x.y`` -> the deepest known module
                    t = t.rpartition(".")[0]
                if t and t != module and t.startswith("dartree"):
                    edges[module].add(t)
    return edges, private


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in edges:
                continue
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _is_package_init(module: str) -> bool:
    return (ROOT.parent / Path(*module.split(".")) / "__init__.py").is_file()


def test_no_import_circle() -> None:
    edges, _ = _graph()
    # a package's __init__ re-exports its submodules: the edges into it from its own submodules are
    # how Python resolves ``from dartree.models import x``, not a dependency between two modules
    pruned = {m: {t for t in ts if not (_is_package_init(t) and m.startswith(t + "."))} for m, ts in edges.items()}
    assert _cycles(pruned) == []


def _layer(module: str) -> str:
    """``dartree.X`` for a module of the subpackage ``dartree.X``; a top-level module is its own layer."""
    return ".".join(module.split(".")[:2])


def test_no_import_circle_between_subpackages() -> None:
    edges, _ = _graph()
    layers: dict[str, set[str]] = {}
    for module, targets in edges.items():
        for target in targets:
            a, b = _layer(module), _layer(target)
            if a != b and "dartree" not in (a, b):      # the package root only re-exports
                layers.setdefault(a, set()).add(b)
                layers.setdefault(b, set())
    assert _cycles(layers) == []


def test_no_private_name_imported_across_modules() -> None:
    _, private = _graph()
    assert private == []


def test_the_graph_reader_sees_a_circle_and_a_private_import() -> None:
    """The checks can fail: a made-up graph with a circle, and the real graph has the edges we know."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    edges, _ = _graph()
    assert "dartree.rounds" in edges["dartree.engine"] and "dartree.engine" in edges["dartree.decode"]
    assert "dartree.decode" in edges["dartree.serve"] and "dartree.engine" in edges["dartree.batch"]
