"""The combined report, opened in a real headless Chromium (Debian's `chromium` package), as
a reader would: at 1300 x 1000 the summary table is in the first viewport; every section shows
its first figure before its claims; no visible table cell holds more than 400 characters
outside a fold; no console errors; every figure is decoded and painted (the screenshot of
each <img> has its natural size and is not a single flat colour); and it reads at phone
width without the page itself scrolling sideways. Skipped (with the reason) where no Chromium
is installed; `.ci/run` installs it.
"""

import io
import shutil

import pytest

from headrank.report import runner as rep
from headrank.studies import registry
from headrank.studies.registry import Claim, Entry, FigureOut, Study
from tests.helpers import Profile

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")




def _probe_a_figures(data, p) -> list:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1, 2], [2, 0, 1])
    fig2, ax2 = plt.subplots(figsize=(3, 3))
    ax2.imshow([[0, 1], [1, 0]])
    return [FigureOut("line", fig, "a line"), FigureOut("grid", fig2, "a grid")]


def _probe_a_claims(data, p) -> list:
    return [Claim("a.one", "test", "one", 1.0, 1.0, True)]


def _probe_b_figures(data, p) -> list:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.bar([0, 1], [3, 1])
    return [FigureOut("bars", fig, "bars")]


def _probe_b_claims(data, p) -> list:
    settings = {f"lr={lr}, eps={eps}": {"distance": lr * eps, "converged": eps > 0.01}
                for lr in (0.1, 0.01, 0.001) for eps in (1e-1, 1e-2, 1e-3, 1e-4)}
    return [Claim("b.one", "test", "<script>not run</script>", 0.5, 1.0, False),
            Claim("b.many", "test", "a long statement " * 40, settings, "<= 0.01 " * 30,
                  verdict="inconclusive", reason="exposure 0.3 < 3 " * 20, detail="how " * 200)]


def test_combined_report_renders_in_chromium(tmp_path, monkeypatch):
    from PIL import Image
    from playwright.sync_api import sync_playwright

    for name, claims, figures in (("browser_probe_a", _probe_a_claims, _probe_a_figures),
                                  ("browser_probe_b", _probe_b_claims, _probe_b_figures)):
        study = Study(name=name, title=name, source="test", params=Profile, run=lambda p: {}, claims=claims,
                      figures=figures)
        monkeypatch.setitem(registry._REGISTRY, name, Entry(name, name, "test", study))
    rep.run_all(tmp_path, quick=True, only=["browser_probe_a", "browser_probe_b"])
    url = (tmp_path / "report.html").resolve().as_uri()
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        page.wait_for_load_state("load")
        # the first screen: what ran and the summary table, entirely inside the first viewport
        box = page.locator("table").first.bounding_box()
        assert "findings held" in page.locator("table").first.inner_text()
        assert box["y"] >= 0 and box["y"] + box["height"] <= 1000
        # every section: its first figure precedes its first claims table
        order = page.evaluate("""() => [...document.querySelectorAll('h2[id]')].map(h => {
            const els = []; for (let e = h.nextElementSibling; e && e.tagName !== 'H2'; e = e.nextElementSibling) els.push(e);
            const fig = els.findIndex(e => e.tagName === 'FIGURE'); const cl = els.findIndex(e => e.querySelector && e.querySelector('table.claims'));
            return [h.id, fig, cl]; })""")
        # the reproductions' sections lead with a figure; the coverage table of the documents'
        # statements is a section of its own, with neither figures nor claims
        studies = [(sid, fig, cl) for sid, fig, cl in order if sid != "coverage"]
        assert [sid for sid, _, _ in studies] == ["browser_probe_a", "browser_probe_b"], order
        assert all(fig != -1 and (cl == -1 or fig < cl) for _, fig, cl in studies), order
        assert ["coverage", -1, -1] in order, order
        # no visible table cell over 400 characters outside a fold (<details> closed by default)
        long_cells = page.evaluate("""() => [...document.querySelectorAll('td, th')].filter(c => c.offsetParent !== null)
            .map(c => { const k = c.cloneNode(true); k.querySelectorAll('details').forEach(d => d.remove());
                        return k.textContent.trim().length; }).filter(n => n > 400)""")
        assert long_cells == []
        assert page.locator(".badge.inconclusive").count() == 1
        imgs = page.locator("figure img")
        assert imgs.count() == 3
        for i in range(imgs.count()):
            img = imgs.nth(i)
            img.scroll_into_view_if_needed()
            assert img.evaluate("e => e.complete && e.naturalWidth > 100 && e.naturalHeight > 100")
            shot = Image.open(io.BytesIO(img.screenshot())).convert("L")
            lo, hi = shot.getextrema()
            assert hi - lo > 50, f"figure {i} painted flat"
        assert page.locator(".badge.not-held").count() >= 1 and page.locator("script").count() == 0
        phone = browser.new_page(viewport={"width": 390, "height": 844})
        phone.goto(url)
        phone.wait_for_load_state("load")
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390 + 1
        browser.close()
    assert errors == []
