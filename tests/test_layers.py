"""The package's layers, read from the source (AST): every import points down or sideways,
never up, and no module imports itself back through others (no cycle), lazy imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import attnrank

ROOT = Path(attnrank.__file__).parent
# lowest first; a module may import from its own layer and the layers before it
LAYERS = ("util", "core", "io", "models", "analysis", "training", "studies", "report", "cli")
BASE = {"attnrank.errors"}  # the one error type, below everything
FACADE = {"attnrank", "attnrank.__main__"}  # the package root (lazy public API) and `python -m`


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(mod: str) -> int:
    if mod in BASE:
        return -1
    if mod in FACADE:
        return LAYERS.index("cli")
    return LAYERS.index(mod.split(".")[1])


def imports(path: Path) -> set[str]:
    """attnrank modules imported anywhere in the file (module level and inside functions)."""
    mod = module_name(path)
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "attnrank"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "attnrank":
                continue
            for a in node.names:  # `from pkg import module` imports the submodule
                sub = f"{target}.{a.name}"
                out.add(sub if (ROOT.parent / Path(*sub.split("."))).with_suffix(".py").exists()
                        or (ROOT.parent / Path(*sub.split(".")) / "__init__.py").exists() else target)
    out.discard(mod)
    return out


GRAPH = {module_name(p): imports(p) for p in sorted(ROOT.rglob("*.py"))}


def test_every_module_sits_in_a_layer():
    for mod in GRAPH:
        assert mod in BASE | FACADE or mod.split(".")[1] in LAYERS, f"{mod} is in no layer"


@pytest.mark.parametrize("mod", sorted(GRAPH))
def test_no_upward_import(mod):
    up = sorted(t for t in GRAPH[mod] if t in GRAPH and layer(t) > layer(mod))
    assert not up, f"{mod} (layer {LAYERS[layer(mod)] if layer(mod) >= 0 else 'base'}) imports from above: {up}"


def test_no_cycle():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(GRAPH.get(m, ())):
            if t not in GRAPH:
                continue
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)


def test_the_test_catches_an_upward_import(tmp_path):
    """The checker itself: an upward import written into a core module is found."""
    bad = ROOT / "core" / "linalg.py"
    src = bad.read_text() + "\nfrom attnrank.report import runner  # noqa\n"
    f = tmp_path / "linalg.py"
    f.write_text(src)
    tree = ast.parse(src)
    found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "attnrank.report" in found and layer("attnrank.report.runner") > layer("attnrank.core.linalg")
