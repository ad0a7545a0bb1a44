"""Every value the report writes is escaped (issue 46: a run.json whose ``runtime_s`` is
``"<script>…"`` was written as it is by ``reproduce --replot``). The test walks every path of a
full run (meta, claims, figures, a combined page) and replaces, one path at a time and then all
at once, the value there by a script; no page may contain it unescaped."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest

from headrank.report.html import render_combined, render_report
from headrank.studies.registry import Claim

EVIL = "<script>alert(1)</script>'\"><img src=x onerror=alert(2)>"


def _sample() -> dict[str, Any]:
    f = Claim("s.f", "paper, Figure 2", "falls", {"a": {"x": 1.0, "y": 2.0}, "b": [1.0, "x"]}, {"lo": 0.5},
              held=True, quote="We observe", rule="trend", key="k 1.0", tolerance=0.1, detail="method").to_json()
    sup = Claim("s.g", "paper", "again", 1.0, 1.0, held=False, supports="s.f", reason="noise").to_json()
    ident = Claim("s.i", "algebra", "identity", 0.0, 0.0, held=True, kind="identity").to_json()
    meta = {"name": "s", "title": "title", "source": "src", "quote": "q", "quote_source": "qs", "runtime_s": 1.5,
            "quick": True, "profile": "quick", "params": {"seed": 0, "grid": [1, 2], "d": {"a": 1}},
            "versions": {"headrank": "1", "torch": "2", "python": "3"}, "notes": ["note one"]}
    figures = [{"name": "fig", "caption": "cap", "png_base64": "aGVsbG8="}]
    return {"meta": meta, "claims": [f, sup, ident], "figures": figures}


def _paths(obj: Any, at: tuple = ()) -> list[tuple]:
    """Every path to a leaf (a string, number, bool or None) and to every key of a dict."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += [(*at, ("key", k))] + _paths(v, (*at, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*at, i))
    else:
        out.append(at)
    return out


def _plant(obj: Any, path: tuple) -> Any:
    obj = copy.deepcopy(obj)
    node = obj
    for step in path[:-1]:
        node = node[step]
    last = path[-1]
    if isinstance(last, tuple):  # a dict key
        node[EVIL] = node.pop(last[1])
    else:
        node[last] = EVIL
    return obj


def _pages(s: dict[str, Any]) -> list[str]:
    entry = SimpleNamespace(name=s["meta"]["name"], meta=s["meta"], claims=s["claims"], error=EVIL)
    return [render_report(**s),
            render_combined(entries=[entry], figures={entry.name: s["figures"]},
                            summary={"profile": "quick", "total_runtime_s": 1.0, "versions": s["meta"]["versions"]})]


def _check(html: str) -> None:
    assert "<script" not in html and "<img src=x" not in html and "onerror=alert(2)>" not in html


def test_every_value_and_key_of_a_run_is_escaped():
    base = _sample()
    free = {"measured", "expected", "params", "versions", "tolerance"}  # dicts whose keys are data, not fields
    paths = [p for p in _paths(base) if len(p) > 1 and p[-1] != "png_base64"
             and (not isinstance(p[-1], tuple) or free & set(p[:-1]))]
    assert len(paths) > 80  # the walk reaches the whole run, not a handful of fields
    for path in paths:
        for html in _pages(_plant(base, path)):
            _check(html)


@pytest.mark.parametrize("field", ["runtime_s", "versions", "params", "notes"])
def test_a_planted_run_json_field_of_another_type_is_escaped(field):
    s = _sample()
    s["meta"][field] = EVIL
    for html in _pages(s):
        _check(html)


def test_a_figure_whose_base64_holds_markup_is_left_out():
    s = _sample()
    s["figures"][0]["png_base64"] = "AAAA' onerror='alert(1)"
    for html in _pages(s):
        assert "onerror='alert(1)" not in html and "base64,AAAA'" not in html
