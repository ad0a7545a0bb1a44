"""Pre-registration you can check: the hash of the rule that judged a claim.

A claim's rule is the code that judged it and every threshold that code reads. Its
``rule_sha256`` is the SHA-256 of a canonical JSON of

- the claim's name;
- the source of the function that built the :class:`~headrank.studies.registry.Claim`
  (``judged_by``, recorded when the claim is made; for a private helper, also the function that
  called it), with every function of the same module it calls (transitively): the rule text is
  formatted there, from the thresholds below;
- the module-level constants (upper-case names) those functions name, and the source of
  :mod:`headrank.studies.verdicts` (the statistics every rule uses);
- the study's params (its profile: every threshold, horizon, grid and seed list fixed there),
  less the fields that cannot change a verdict (:data:`OPERATIONAL`).

The hash does not read the data, so it can be recomputed from the code and a profile alone
(docs/preregistration.py writes docs/preregistration.json that way, and a test checks the
file against the code). See docs/METHODS.md §4 ("Pre-registration").
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import sys
from dataclasses import asdict, is_dataclass
from typing import Any

#: params fields that cannot change a verdict: parallelism, and the checkpoint a user points at
OPERATIONAL = frozenset({"workers", "threads", "model"})
_STUDIES = "headrank.studies."


def caller() -> str:
    """``module:qualname`` of the studies function that is building a claim (and, when it is a
    private helper, of the study function that called it; never the ``claims`` aggregator that
    calls them all), for ``Claim.judged_by``."""
    out: list[str] = []
    f = sys._getframe(1)
    while f is not None:
        mod = f.f_globals.get("__name__", "")
        name = f.f_code.co_qualname if hasattr(f.f_code, "co_qualname") else f.f_code.co_name
        if (mod.startswith(_STUDIES) and mod not in (f"{_STUDIES}registry", __name__) and "<" not in name
                and name != "claims"):
            out.append(f"{mod}:{name}")
            if not name.split(".")[-1].startswith("_") or len(out) == 2:
                break  # a study's claim function; a helper (_name) also records who called it
        f = f.f_back
    return ",".join(out)


def static_digest(source: str, funcs: list[str]) -> str | None:
    """The rule's code in a module's ``source``: the functions ``funcs`` with every module function
    they name (transitively) and the module's upper-case constants they name, each normalised by
    the AST (comments and layout do not count); None when a function is missing or the source
    does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    consts = {t.id: n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
              for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
              if isinstance(t, ast.Name) and t.id.isupper()}
    if any(f not in defs for f in funcs):
        return None
    todo, seen, named = list(funcs), set(), set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        node = defs.get(f) or consts.get(f)
        if node is None:
            continue
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        named |= names & set(consts)
        todo += [n for n in names if n in defs or n in consts]
    return "\n".join([*(ast.unparse(defs[f]) for f in sorted(seen & set(defs))),
                      *(ast.unparse(consts[c]) for c in sorted(named))])


def _code(spec: str) -> str:
    """The rule's code that ``spec`` (``module:function``) names (:func:`static_digest`)."""
    mod_name, func = spec.split(":")
    digest = static_digest(inspect.getsource(importlib.import_module(mod_name)), [func.split(".")[0]])
    return f"{mod_name}:{digest}"


def thresholds(params: Any) -> dict[str, Any]:
    """The study's params as judged (a dataclass or its ``asdict``), less :data:`OPERATIONAL`."""
    d = asdict(params) if is_dataclass(params) else dict(params or {})
    return {k: v for k, v in sorted(d.items()) if k not in OPERATIONAL}


def rule_sha256(name: str, judged_by: str, params: Any) -> str:
    """The hash of claim ``name``'s rule (module docstring): its code and its thresholds."""
    verdicts = importlib.import_module(f"{_STUDIES}verdicts")
    payload = {"claim": name, "code": [_code(s) for s in judged_by.split(",") if s],
               "verdicts": hashlib.sha256(inspect.getsource(verdicts).encode()).hexdigest(),
               "thresholds": thresholds(params)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=repr).encode()).hexdigest()


def stamp(claims: list[Any], params: Any) -> None:
    """Set ``rule_sha256`` on each of ``claims`` (Claim objects) judged under ``params``."""
    for c in claims:
        c.rule_sha256 = rule_sha256(c.name, c.judged_by, params)


def git_commit() -> str:
    """The commit of the checkout this package runs from (``+dirty`` with uncommitted changes),
    or "" outside a git checkout: recorded in run.json beside the rule hashes."""
    import subprocess
    from pathlib import Path

    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"{head}+dirty" if dirty else head
