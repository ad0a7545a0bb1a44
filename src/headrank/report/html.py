"""HTML rendering of reproduction reports: one self-contained file, no external assets.

Laid out like a paper's results section: what ran and a summary table first (one row per
reproduction: findings held / not held / inconclusive, identities verified, our checks, runtime), a
plain-language reading, then one section per reproduction — the document's own statement,
our figures right under it, then the claims as compact rows in four groups (the documents'
findings with their verbatim quotes, supporting evidence, our checks, identities: verdict,
one-line statement, the key measured number next to the expected one, exposure) with everything
longer (the pre-registered rule included) folded in ``<details>``; the combined page ends with
the coverage table (every statement of the documents and the claim that tests it, or why none
can). Rendering only: every number shown was computed by the reproduction; figures
arrive as base64 PNG and are embedded as ``data:`` URIs.
"""

from __future__ import annotations

import math
from html import escape as _escape
from typing import Any

from headrank.studies.registry import statements, supporting, tally

_CSS = """
:root { --held: #155d15; --held-bg: #e3f2e3; --no: #8a1010; --no-bg: #fbe4e4; --inc: #7a5a00; --inc-bg: #fdf3d2; }
body { font-family: system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 1.2rem auto;
       max-width: 1180px; padding: 0 0.8rem; color: #222; line-height: 1.4; }
h1 { font-size: 1.4rem; margin: 0 0 0.2rem; } h2 { font-size: 1.2rem; margin-top: 2.2rem; border-top: 1px solid #ddd;
     padding-top: 0.8rem; } h3 { font-size: 1rem; }
.sub { color: #555; margin: 0.2rem 0; font-size: 0.88rem; }
.wrap { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.86rem; margin: 0.4rem 0; }
th, td { border: 1px solid #d4d4d4; padding: 0.25rem 0.45rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; font-weight: 600; }
td.n { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 0.8rem; white-space: nowrap; }
table.claims { width: 100%; } table.claims td.st { min-width: 16rem; }
table.claims td.n { white-space: normal; max-width: 14rem; overflow-wrap: anywhere; }
.badge { display: inline-block; padding: 0.05rem 0.4rem; border-radius: 0.6rem; font-size: 0.78rem;
         font-weight: 600; white-space: nowrap; }
.held { background: var(--held-bg); color: var(--held); } .not-held { background: var(--no-bg); color: var(--no); }
.inconclusive { background: var(--inc-bg); color: var(--inc); }
.failed { background: var(--no-bg); color: var(--no); font-weight: 600; }
blockquote { margin: 0.6rem 0; padding: 0.4rem 0.8rem; border-left: 4px solid #9ab; background: #f6f8fa;
             font-size: 0.9rem; } blockquote cite { display: block; color: #555; font-size: 0.8rem; margin-top: 0.3rem; }
figure { margin: 0.8rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #ddd; }
figcaption { font-size: 0.85rem; color: #333; margin-top: 0.3rem; }
details { margin: 0.2rem 0; font-size: 0.85rem; } summary { cursor: pointer; color: #245; }
details > div { padding: 0.3rem 0.6rem; border-left: 2px solid #ddd; margin: 0.2rem 0 0.6rem; }
.reading { font-size: 0.95rem; max-width: 60rem; }
@media print { details > div { display: block; } summary { display: none; } h2 { break-before: page; } }
"""

_VERDICT_CLASS = {"held": "held", "not held": "not-held", "inconclusive": "inconclusive"}
MAX_CELL = 300  # characters of a statement shown in a claims row; the rest is folded
MAX_VISIBLE = 400  # characters of text any table cell shows; the rest goes into a fold beside it


def esc(v: Any) -> str:
    """Any value as HTML-safe text: a string escaped, anything else formatted (:func:`fmt_value`)
    and escaped. The one way a value reaches the page: every string a run, a claim or a figure
    holds may come from a planted run.json (``runtime_s`` = ``"<script>…"``)."""
    return _escape(v if isinstance(v, str) else fmt_value(v))


def clipped(text: str, limit: int = MAX_VISIBLE) -> str:
    """``text`` escaped for a table cell; longer than ``limit``, its start and the whole of it
    in a fold (so no visible cell grows with the rules or the data)."""
    text = text if isinstance(text, str) else fmt_value(text)
    if len(text) <= limit:
        return esc(text)
    head = text[:limit - 40].rsplit(" ", 1)[0] + " …"
    return f"{esc(head)}<details><summary>all of it</summary><div>{esc(text)}</div></details>"


# --------------------------------------------------------------------------- numbers


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
        if len(v) <= 8 and all(_is_num(x) for x in v):
            return "[" + ", ".join(fmt_value(x, digits) for x in v) + "]"
        return "\n".join(fmt_value(x, digits) for x in v)
    return str(v)


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _numbers(v: Any) -> list[float]:
    """Every finite number inside a value (nested dicts and lists)."""
    if _is_num(v):
        return [float(v)] if math.isfinite(v) else []
    if isinstance(v, dict):
        return [x for y in v.values() for x in _numbers(y)]
    if isinstance(v, list | tuple):
        return [x for y in v for x in _numbers(y)]
    return []


def brief(v: Any) -> str:
    """One short line for a claims row: a number, a short string, a small dict inline, or the
    range of the numbers of a larger value (the full value is in the fold)."""
    if v is None or _is_num(v) or isinstance(v, bool):
        return fmt_value(v, 4)
    if isinstance(v, str):
        return v if len(v) <= 100 else v[:97].rstrip() + "…"
    if isinstance(v, dict) and len(v) <= 4 and all(_is_num(x) or x is None or isinstance(x, bool | str)
                                                    for x in v.values()):
        text = "; ".join(f"{k}: {fmt_value(x, 4)}" for k, x in v.items())
        if len(text) <= 80:
            return text
    if isinstance(v, list | tuple) and len(v) <= 4 and all(_is_num(x) for x in v):
        return fmt_value(list(v), 3)
    nums = _numbers(v)
    if not nums:
        n = len(v) if isinstance(v, dict | list | tuple) else 0
        return f"{n} entries (in details)"
    lo, hi = min(nums), max(nums)
    if lo == hi:
        return f"{fmt_value(lo, 3)} (all {len(nums)} values)"
    return f"{fmt_value(lo, 3)} … {fmt_value(hi, 3)} ({len(nums)} values)"


def measured_brief(c: dict[str, Any]) -> str:
    """A claim's "measured" cell: its ``key`` (the decisive numbers, written by the claim) or, for
    claims without one, :func:`brief` of everything it measured."""
    return c.get("key") or brief(c.get("measured"))


def value_html(v: Any) -> str:
    """A value for reading: scalars formatted, dicts as small tables (dicts of dicts as one
    table with a column per inner key), lists inline or one per line."""
    if isinstance(v, dict) and v:
        inner = list(v.values())
        if all(isinstance(x, dict) for x in inner):
            cols = list(dict.fromkeys(k for x in inner for k in x))
            if len(cols) <= 8 and all(not isinstance(y, dict | list) for x in inner for y in x.values()):
                head = "".join(f"<th>{esc(str(c))}</th>" for c in cols)
                rows = "".join(f"<tr><th>{esc(str(k))}</th>"
                               + "".join(f"<td class='n'>{esc(fmt_value(x.get(c), 4))}</td>" for c in cols) + "</tr>"
                               for k, x in v.items())
                return f"<div class='wrap'><table><tr><th></th>{head}</tr>{rows}</table></div>"
        rows = "".join(f"<tr><th>{esc(str(k))}</th><td class='n'>{value_html(x)}</td></tr>" for k, x in v.items())
        return f"<div class='wrap'><table>{rows}</table></div>"
    if isinstance(v, list | tuple) and v and not all(_is_num(x) for x in v):
        return "<br>".join(value_html(x) for x in v)
    return esc(fmt_value(v, 4))


# --------------------------------------------------------------------------- pieces


def _badge(c: dict[str, Any]) -> str:
    verdict = c.get("verdict") or ("held" if c.get("held") else "not held")
    if c.get("kind") == "identity":
        cls, text = ("held", "verified") if verdict == "held" else ("not-held", "identity failed")
    else:
        cls, text = _VERDICT_CLASS.get(verdict, "inconclusive"), verdict
    if c.get("untested"):
        text = f"untested ({c['untested']})"
    changed = (" <span class='sub' title='the rule that judged this claim was changed after its run was made'>"
               "(rule changed after the run)</span>" if c.get("rule_changed_after_run") else "")
    return f"<span class='badge {cls}'>{esc(text)}</span>{changed}"


def _exposure_text(e: Any) -> str:
    if e is None or e == {}:
        return ""
    if isinstance(e, dict):
        got, need = e.get("got", e.get("exposure")), e.get("needed", e.get("need"))
        if got is not None and need is not None:
            return f"{brief(got)} (needs ≥ {brief(need)})"
    return brief(e)


def _claim_rows(claims: list[dict[str, Any]], with_exposure: bool) -> str:
    rows = []
    for c in claims:
        st = c.get("statement", "")
        room = max(80, min(MAX_CELL, MAX_VISIBLE - len(c["name"]) - 2))
        short = st if len(st) <= room else st[:room].rsplit(" ", 1)[0] + " …"
        quote = c.get("quote") if c.get("quote") and not c.get("supports") else ""
        fold = []
        if quote and len(c["name"]) + len(short) + len(quote) + len(c.get("source", "")) + 2 > MAX_VISIBLE:
            fold.append(f"<blockquote>{esc(quote)}<cite>{esc(c.get('source', ''))}</cite></blockquote>")
            quote = ""  # too long to sit beside the statement: first in the fold
        if short != st:
            fold.append(f"<p>{esc(st)}</p>")
        if c.get("reason"):
            fold.append(f"<p><b>Why {esc(c.get('verdict', ''))}:</b> {esc(c['reason'])}</p>")
        fold.append(f"<p><b>Measured</b></p>{value_html(c.get('measured'))}")
        fold.append(f"<p><b>Expected</b></p>{value_html(c.get('expected'))}")
        if c.get("tolerance") not in (None, ""):
            fold.append(f"<p><b>Tolerance:</b> {esc(fmt_value(c['tolerance']))}</p>")
        if c.get("exposure") not in (None, {}):
            fold.append(f"<p><b>Decay exposure λ·Σlr</b></p>{value_html(c['exposure'])}")
        if c.get("detail"):
            fold.append(f"<p><b>Method:</b> {esc(c['detail'])}</p>")
        if c.get("rule"):
            fold.append(f"<p><b>Rule (fixed before the run):</b> {esc(c['rule'])}</p>")
        if c.get("supports"):
            fold.append(f"<p><b>Supporting evidence of</b> {esc(c['supports'])} (not counted again where both are reported)</p>")
        fold.append(f"<p class='sub'>source: {esc(c.get('source', ''))}</p>")
        exp = f"<td class='n'>{esc(_exposure_text(c.get('exposure')))}</td>" if with_exposure else ""
        rows.append(
            f"<tr><td>{_badge(c)}</td><td class='st'><b>{esc(c['name'])}</b> {esc(short)}"
            + (f"<blockquote>{esc(quote)}<cite>{esc(c.get('source', ''))}</cite></blockquote>" if quote else "")
            + f"<details><summary>details</summary><div>{''.join(fold)}</div></details></td>"
            f"<td class='n'>{clipped(measured_brief(c))}</td><td class='n'>{clipped(brief(c.get('expected')))}</td>"
            f"{exp}</tr>")
    head = "<tr><th>verdict</th><th>claim</th><th>measured</th><th>expected</th>" + \
        ("<th>exposure</th>" if with_exposure else "") + "</tr>"
    return f"<div class='wrap'><table class='claims'>{head}{''.join(rows)}</table></div>"


def _figures_html(figures: list[dict[str, Any]]) -> str:
    return "".join(
        f"<figure><img alt='{esc(f['name'])}' src='data:image/png;base64,{_base64(f['png_base64'])}'>"
        f"<figcaption><b>{esc(f['name'])}</b>: {esc(f.get('caption', ''))}</figcaption></figure>"
        for f in figures)


def _base64(data: Any) -> str:
    """A figure's PNG as base64 text, nothing else (no quote can leave the attribute)."""
    import re

    return data if isinstance(data, str) and re.fullmatch(r"[A-Za-z0-9+/=\s]*", data) else ""


def _kv_table(d: dict[str, Any]) -> str:
    if not isinstance(d, dict):  # a planted run.json: whatever it holds is shown as text
        return value_html(d)
    rows = "".join(f"<tr><th>{esc(str(k))}</th><td class='n'>{value_html(v)}</td></tr>" for k, v in d.items())
    return f"<div class='wrap'><table>{rows}</table></div>"


def _section(name: str, meta: dict[str, Any], claims: list[dict[str, Any]], figures: list[dict[str, Any]],
             error: str | None = None) -> str:
    """One reproduction: statement quoted, figures, claims, then folds (notes, parameters)."""
    quote = meta.get("quote")
    cite = meta.get("quote_source") or meta.get("source", "")
    groups = claim_groups(claims)
    exposure = any(c.get("exposure") not in (None, {}) for c in claims if c.get("kind") != "identity")
    notes = "".join(f"<li>{esc(n)}</li>" for n in meta.get("notes", []))
    prof = meta.get("profile") or ("quick" if meta.get("quick") else "full")
    parts = [f"<h2 id='{esc(name)}'>{esc(name)}: {esc(meta.get('title', ''))}</h2>",
             f"<p class='sub'>{esc(prof)} profile; runtime {esc(fmt_value(meta.get('runtime_s'), 3))} s</p>"]
    if quote:
        parts.append(f"<blockquote>{esc(quote)}<cite>{esc(cite)}</cite></blockquote>")
    if error:
        parts.append(f"<p class='failed'>failed: {esc(error)}</p>")
    parts.append(_figures_html(figures))
    for key, title in GROUP_TITLES.items():
        if groups[key]:
            parts.append(f"<h3>{title}</h3>{_claim_rows(groups[key], exposure and key != 'identities')}")
    if notes:
        parts.append(f"<details><summary>notes</summary><div><ul>{notes}</ul></div></details>")
    parts.append(f"<details><summary>parameters</summary><div>{_kv_table(meta.get('params', {}))}</div></details>")
    return "".join(parts)


#: how a reproduction's claims are listed, in this order
GROUP_TITLES = {
    "findings": "Findings (statements of the documents; each counted once)",
    "supporting": "Supporting evidence (re-tests of a finding's comparison; not counted again)",
    "checks": "Our checks (sanity checks and standard theory the documents do not state; tallied apart)",
    "identities": "Identities (algebra; verified)",
}


def claim_groups(claims: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Claims split as the tally counts them: findings, supporting evidence, our checks, identities."""
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in GROUP_TITLES}
    names = {c.get("name") for c in claims}
    for c in claims:
        kind = c.get("kind", "finding")
        key = ("identities" if kind == "identity" else "checks" if kind == "check"
               else "supporting" if supporting(c, names) else "findings")
        out[key].append(c)
    return out


def _summary_table(rows: list[tuple[str, dict[str, Any], list[dict[str, Any]], str | None]]) -> str:
    out = []
    names = {c.get("name") for _, _, claims, _ in rows for c in claims}
    for name, meta, claims, error in rows:
        t = tally(claims, names)
        f, i = t["findings"], t["identities"]
        ident = f"{i['verified']} / {i['verified'] + i['failed']}" if i["verified"] + i["failed"] else "—"
        ch = t["checks"]
        checks = f"{ch['held']} / {sum(ch.values())}" if sum(ch.values()) else "—"
        note = "<span class='failed'>failed</span>" if error else ""
        out.append(f"<tr><td><a href='#{esc(name)}'>{esc(name)}</a> {note}</td>"
                   f"<td>{esc(_short_title(meta.get('title', '')))}</td>"
                   f"<td class='n'>{f['held']}</td><td class='n'>{f['not held']}</td><td class='n'>{f['inconclusive']}</td>"
                   f"<td class='n'>{ident}</td><td class='n'>{checks}</td>"
                   f"<td class='n'>{esc(fmt_value(meta.get('runtime_s'), 3))} s</td></tr>")
    head = ("<tr><th>reproduction</th><th>what</th><th>findings held</th><th>not held</th><th>inconclusive</th>"
            "<th>identities verified</th><th>our checks held</th><th>runtime</th></tr>")
    return f"<div class='wrap'><table>{head}{''.join(out)}</table></div>"


def _short_title(title: str) -> str:
    t = title.split(";")[0].split(":")[0]
    return t if len(t) <= 80 else t[:77] + "…"


def reading(claims: list[dict[str, Any]]) -> str:
    """A plain-language paragraph: how many findings held, which did not and which stayed
    inconclusive (with the first reason given), and the identities."""
    t = tally(claims)
    f, i, ch = t["findings"], t["identities"], t["checks"]
    n = sum(f.values())
    groups = claim_groups(claims)
    text = [f"Of the {n} statements of the documents checked (each counted once), {f['held']} held, "
            f"{f['not held']} did not hold and {f['inconclusive']} were inconclusive."]
    sts = statements(claims)
    for verdict, label in (("not held", "Did not hold"), ("inconclusive", "Inconclusive")):
        names = [" + ".join(st["claims"]) for st in sts if st["verdict"] == verdict]
        if names:
            text.append(f"{label}: {', '.join(names)} (each one's reason is in its details).")
    untested = [st for st in sts if st["verdict"] == "untested"]
    if untested:
        text.append(f"{len(untested)} statements could not be tested here and are not counted among those checked: "
                    + "; ".join(f"{' + '.join(st['claims'])} (tested by: {st['untested'][0]})" for st in untested)
                    + ".")
    against = [c["name"] for c in groups["supporting"] if c.get("verdict") != "held"]
    if groups["supporting"]:
        text.append(f"{len(groups['supporting'])} re-tests are listed as supporting evidence, not counted again"
                    + (f"; not held or inconclusive among them: {', '.join(against)}." if against else "."))
    if sum(ch.values()):
        text.append(f"Our own checks (not statements of the documents): {ch['held']} held, {ch['not held']} not held, "
                    f"{ch['inconclusive']} inconclusive.")
    if i["verified"] + i["failed"]:
        text.append(f"{i['verified']} of {i['verified'] + i['failed']} algebraic identities were verified"
                    + ("." if not i["failed"] else "; a failed identity means a bug, not a finding."))
    return " ".join(text)


def coverage_html(by_name: dict[str, dict[str, Any]]) -> str:
    """The coverage table: every statement of the documents that reports an experiment or a
    theorem, the claims that test it (with their verdicts here) or why none can."""
    from headrank.studies.coverage import COVERAGE

    rows = []
    for doc, place, statement, tested, why in COVERAGE:
        cells = []
        for n in (x.strip() for x in tested.split(",") if x.strip()):
            c = by_name.get(n)
            cells.append(f"{esc(n)} {_badge(c)}" if c else f"{esc(n)} <span class='sub'>(not run)</span>")
        rows.append(f"<tr><td>{esc(doc)}</td><td>{clipped(place)}</td><td>{clipped(statement)}</td>"
                    f"<td class='n'>{'<br>'.join(cells) or '—'}</td><td>{clipped(why)}</td></tr>")
    head = "<tr><th>document</th><th>place</th><th>statement</th><th>tested by</th><th>note</th></tr>"
    return (f"<h2 id='coverage'>Coverage: every statement of the documents</h2><div class='wrap'><table>{head}"
            f"{''.join(rows)}</table></div>")


def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>{body}</body></html>\n")


def _versions_line(v: dict[str, Any]) -> str:
    if not isinstance(v, dict):
        return fmt_value(v)
    keys = ("headrank", "torch", "numpy", "scipy", "python")
    return ", ".join(f"{k} {v[k]}" for k in keys if k in v)


# --------------------------------------------------------------------------- pages


def render_report(*, meta: dict[str, Any], claims: list[dict[str, Any]], figures: list[dict[str, Any]]) -> str:
    """The report of one reproduction as one HTML string.

    ``meta``: name, title, source, quick, runtime_s, params, versions, notes (and optionally
    quote, quote_source). ``claims``: claim dicts as in claims.json. ``figures``: dicts with
    name, caption, png_base64.
    """
    name = meta["name"]
    body = (f"<h1>headrank reproduce {esc(name)}</h1>"
            f"<p class='sub'>{esc(meta.get('profile') or ('quick' if meta.get('quick') else 'full'))} profile, "
            f"{esc(fmt_value(meta.get('runtime_s'), 3))} s; {esc(_versions_line(meta.get('versions', {})))}</p>"
            + _summary_table([(name, meta, claims, None)])
            + f"<p class='reading'>{esc(reading(claims))}</p>"
            + _section(name, meta, claims, figures)
            + f"<details><summary>library versions</summary><div>{_kv_table(meta.get('versions', {}))}</div></details>"
            "<p class='sub'>Raw series: data.json; claims: claims.json; run metadata: run.json.</p>")
    return _page(f"headrank reproduce {name}", body)


def render_combined(*, entries: list[Any], figures: dict[str, list[dict[str, Any]]],
                    summary: dict[str, Any]) -> str:
    """One page for every reproduction: what ran and the summary table first, a plain-language
    reading, then one section per reproduction. ``entries`` are runner.AllEntry."""
    profile = summary.get("profile") or ("quick" if summary.get("quick") else "full")
    all_claims = [c for e in entries for c in e.claims]
    rows = [(e.name, e.meta, e.claims, e.error) for e in entries]
    body = (f"<h1>headrank: which of the documents' statements hold here</h1>"
            f"<p class='sub'>reproduce all, {esc(profile)} profile; total runtime "
            f"{esc(fmt_value(summary.get('total_runtime_s'), 4))} s; "
            f"{esc(_versions_line(summary.get('versions', {})))}</p>"
            + _summary_table(rows)
            + f"<p class='reading'>{esc(reading(all_claims))}</p>"
            + "".join(_section(e.name, e.meta, e.claims, figures.get(e.name, []), e.error) for e in entries)
            + coverage_html({c["name"]: c for c in all_claims})
            + f"<h2>Environment</h2>{_kv_table(summary.get('versions', {}))}"
            "<p class='sub'>Per-reproduction reports, claims, raw data and PNGs are in the NAME/ folders beside "
            "this file; all claims: claims.json; runtimes: summary.json.</p>")
    return _page(f"headrank reproduce all ({profile})", body)
