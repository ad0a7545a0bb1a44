"""HTML rendering of a reproduction report: one self-contained file, no external assets.

Rendering only: everything shown here was computed by the reproduction. Figures arrive as
base64 PNG and are embedded as ``data:`` URIs.
"""

from __future__ import annotations

import json
import math
from html import escape
from typing import Any

_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 2rem auto;
       max-width: 1200px; padding: 0 1rem; color: #222; line-height: 1.4; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
.sub { color: #555; margin-top: 0; }
table { border-collapse: collapse; width: 100%; font-size: 0.88rem; }
th, td { border: 1px solid #ccc; padding: 0.35rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; white-space: pre-wrap; font-size: 0.82rem; }
.held { background: #e6f4e6; color: #155d15; font-weight: bold; }
.failed { background: #fbe4e4; color: #8a1010; font-weight: bold; }
.detail { color: #444; font-size: 0.82rem; }
figure { margin: 1.5rem 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.88rem; color: #333; margin-top: 0.4rem; }
pre { background: #f7f7f7; padding: 0.6rem; overflow-x: auto; font-size: 0.8rem; }
"""


def fmt_value(v: Any, digits: int = 4) -> str:
    """Compact text for a measured/expected value: numbers to ``digits`` significant digits."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v == 0:
            return "0"
        if 1e-3 <= abs(v) < 1e5:
            return f"{v:.{digits}g}"
        return f"{v:.{max(digits - 1, 1)}e}"
    if isinstance(v, str):
        return v
    if isinstance(v, dict):
        return "\n".join(f"{k}: {fmt_value(x, digits)}" for k, x in v.items())
    if isinstance(v, list | tuple):
        if len(v) <= 8 and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v):
            return "[" + ", ".join(fmt_value(x, digits) for x in v) + "]"
        return "\n".join(fmt_value(x, digits) for x in v)
    return str(v)


def _claims_table(claims: list[dict[str, Any]]) -> str:
    rows = []
    for c in claims:
        verdict = '<td class="held">held</td>' if c["held"] else '<td class="failed">did not hold</td>'
        tol = "" if c.get("tolerance") in (None, "") else fmt_value(c["tolerance"])
        rows.append(
            "<tr>"
            f"{verdict}"
            f"<td><b>{escape(c['name'])}</b><br>{escape(c['statement'])}"
            f"<div class='detail'>source: {escape(c['source'])}</div>"
            + (f"<div class='detail'>{escape(c['detail'])}</div>" if c.get("detail") else "")
            + "</td>"
            f"<td class='num'>{escape(fmt_value(c['measured']))}</td>"
            f"<td class='num'>{escape(fmt_value(c['expected']))}</td>"
            f"<td class='num'>{escape(tol)}</td>"
            "</tr>"
        )
    head = "<tr><th>verdict</th><th>claim</th><th>measured</th><th>expected</th><th>tolerance</th></tr>"
    return f"<table>{head}{''.join(rows)}</table>"


def _kv_table(d: dict[str, Any]) -> str:
    rows = "".join(f"<tr><th>{escape(str(k))}</th><td class='num'>{escape(_param_text(v))}</td></tr>"
                   for k, v in d.items())
    return f"<table>{rows}</table>"


def _param_text(v: Any) -> str:
    if isinstance(v, dict | list):
        return json.dumps(v)
    return fmt_value(v, 6)


def render_report(*, meta: dict[str, Any], claims: list[dict[str, Any]], figures: list[dict[str, Any]]) -> str:
    """The whole report as one HTML string.

    ``meta``: name, title, source, quick, runtime_s, params, versions, notes.
    ``claims``: claim dicts (see reproduce.Claim). ``figures``: dicts with name, caption,
    png_base64.
    """
    n_held = sum(bool(c["held"]) for c in claims)
    figs = "".join(
        f"<figure><img alt='{escape(f['name'])}' src='data:image/png;base64,{f['png_base64']}'>"
        f"<figcaption><b>{escape(f['name'])}</b>: {escape(f.get('caption', ''))}</figcaption></figure>"
        for f in figures
    )
    notes = "".join(f"<li>{escape(n)}</li>" for n in meta.get("notes", []))
    quick = " (quick variant)" if meta.get("quick") else ""
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>attnrank reproduce {escape(meta['name'])}</title><style>{_CSS}</style></head><body>"
        f"<h1>attnrank reproduce {escape(meta['name'])}{quick}</h1>"
        f"<p class='sub'>{escape(meta.get('title', ''))}<br>source: {escape(meta.get('source', ''))}<br>"
        f"runtime {meta.get('runtime_s', float('nan')):.2f} s</p>"
        f"<h2>Claims: {n_held} of {len(claims)} held</h2>{_claims_table(claims)}"
        + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "")
        + f"<h2>Figures</h2>{figs}"
        f"<h2>Parameters</h2>{_kv_table(meta.get('params', {}))}"
        f"<h2>Library versions</h2>{_kv_table(meta.get('versions', {}))}"
        "<p class='sub'>Raw series: data.json; claims: claims.json; run metadata: run.json.</p>"
        "</body></html>\n"
    )


def render_combined(*, entries: list[Any], figures: dict[str, list[dict[str, Any]]],
                    summary: dict[str, Any]) -> str:
    """One page for every reproduction: all claims first, then each reproduction's figures,
    parameters and runtime, then the environment. ``entries`` are reproduce.AllEntry."""
    claims = [{**c, "name": f"{e.name}: {c['name']}"} for e in entries for c in e.claims]
    errors = "".join(f"<li><b>{escape(e.name)}</b> failed: {escape(e.error)}</li>" for e in entries if e.error)
    index = "".join(
        f"<tr><td><a href='#{escape(e.name)}'>{escape(e.name)}</a></td><td>{escape(e.meta.get('title', ''))}</td>"
        f"<td class='num'>{sum(bool(c['held']) for c in e.claims)} / {len(e.claims)}</td>"
        f"<td class='num'>{fmt_value(e.meta.get('runtime_s'), 3)} s{' (cached)' if e.cached else ''}</td></tr>"
        for e in entries
    )
    sections = []
    for e in entries:
        figs = "".join(
            f"<figure><img alt='{escape(f['name'])}' src='data:image/png;base64,{f['png_base64']}'>"
            f"<figcaption><b>{escape(f['name'])}</b>: {escape(f.get('caption', ''))}</figcaption></figure>"
            for f in figures.get(e.name, [])
        )
        notes = "".join(f"<li>{escape(n)}</li>" for n in e.meta.get("notes", []))
        sections.append(
            f"<h2 id='{escape(e.name)}'>{escape(e.name)}: {escape(e.meta.get('title', ''))}</h2>"
            f"<p class='sub'>source: {escape(e.meta.get('source', ''))}; runtime "
            f"{fmt_value(e.meta.get('runtime_s'), 3)} s</p>"
            + (f"<p class='failed'>failed: {escape(e.error)}</p>" if e.error else "")
            + (f"<ul>{notes}</ul>" if notes else "") + figs
            + f"<h3>Parameters</h3>{_kv_table(e.meta.get('params', {}))}"
        )
    profile = "quick" if summary.get("quick") else "full"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>attnrank reproduce all ({profile})</title><style>{_CSS}</style></head><body>"
        f"<h1>attnrank reproduce all ({profile} profile)</h1>"
        f"<p class='sub'>{summary['claims_held']} of {summary['claims_total']} claims held; total runtime "
        f"{fmt_value(summary.get('total_runtime_s'), 4)} s</p>"
        + (f"<h2>Errors</h2><ul>{errors}</ul>" if errors else "")
        + f"<h2>Claims</h2>{_claims_table(claims)}"
        f"<h2>Reproductions</h2><table><tr><th>name</th><th>title</th><th>held</th><th>runtime</th></tr>"
        f"{index}</table>" + "".join(sections)
        + f"<h2>Environment</h2>{_kv_table(summary.get('versions', {}))}"
        "<p class='sub'>Per-reproduction reports, claims, raw data and PNGs are in the NAME/ folders beside "
        "this file; all claims: claims.json; runtimes: summary.json.</p></body></html>\n"
    )
