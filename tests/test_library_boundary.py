"""The boundary between library and command line, read from the source (AST): no module outside
``headrank.cli`` imports typer, and no library error message names a ``--flag`` (a Python user
passes parameters; the CLI maps the parameter names an error gives in backticks to its flags)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import headrank

ROOT = Path(headrank.__file__).parent
LIBRARY = sorted(p for p in ROOT.rglob("*.py") if "cli" not in p.relative_to(ROOT).parts)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _error_strings(tree: ast.AST):
    """Every string constant inside a ``HeadRankError(...)`` call."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name == "HeadRankError":
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    for sub in ast.walk(arg):
                        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                            yield node.lineno, sub.value
                        elif isinstance(sub, ast.JoinedStr):  # an f-string: its text, "x" for each field
                            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "x"
                                                       for v in sub.values)


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_library_module_imports_no_typer_and_names_no_flag(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(a.name.split(".")[0] in ("typer", "click") for a in node.names), path
        elif isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] not in ("typer", "click"), path
    flags = [(line, m) for line, s in _error_strings(tree) for m in FLAG.findall(s)]
    assert not flags, f"{path.relative_to(ROOT)} names CLI flags in errors: {flags}"


def test_the_cli_maps_parameter_names_to_flags():
    from headrank.cli.common import flag_message

    assert flag_message("`layers` must look like 0,2", {"layers": "--layers"}) == "--layers must look like 0,2"
    assert flag_message("`attn_weight_decay` is fixed", {}) == "--attn-wd is fixed"
    assert flag_message("use `out` and `scales`", {"scales": "--scales"}) == "use --out and --scales"
    assert flag_message("`x` left as it is", {}) == "`x` left as it is"


def test_docstrings_cite_pages_of_the_repository():
    """Docstrings cite pages under docs/ that exist, never REFERENCE.md (outside the repository)."""
    docs = ROOT.parents[1] / "docs"
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if path.name != "registry.py":
                    assert "REFERENCE.md" not in node.value, path
                for page in re.findall(r"docs/([\w/.-]+\.md)", node.value):
                    assert (docs / page).is_file(), f"{path.relative_to(ROOT)} cites docs/{page}, which is missing"
