"""The combined report, opened in a real headless Chromium (Debian's `chromium` package).

No console errors, and every figure is decoded and painted: the screenshot of each <img>
has its natural size and is not a single flat colour. Skipped (with the reason) where no
Chromium is installed; `.ci/run` installs it.
"""

import io
import shutil

import pytest

from attnrank.report import runner as rep
from attnrank.studies import registry
from attnrank.studies.registry import Claim, Entry, FigureOut, Result

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")


def _probe_a(quick: bool = False) -> Result:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1, 2], [2, 0, 1])
    fig2, ax2 = plt.subplots(figsize=(3, 3))
    ax2.imshow([[0, 1], [1, 0]])
    return Result(claims=[Claim("a.one", "test", "one", 1.0, 1.0, True)],
                  figures=[FigureOut("line", fig, "a line"), FigureOut("grid", fig2, "a grid")])


def _probe_b(quick: bool = False) -> Result:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.bar([0, 1], [3, 1])
    return Result(claims=[Claim("b.one", "test", "<script>not run</script>", 0.5, 1.0, False)],
                  figures=[FigureOut("bars", fig, "bars")])


def test_combined_report_renders_in_chromium(tmp_path, monkeypatch):
    from PIL import Image
    from playwright.sync_api import sync_playwright

    for name, fn in (("browser_probe_a", _probe_a), ("browser_probe_b", _probe_b)):
        monkeypatch.setitem(registry._REGISTRY, name, Entry(name, name, "test", fn))
    rep.run_all(tmp_path, quick=True, only=["browser_probe_a", "browser_probe_b", "fig4"])
    url = (tmp_path / "report.html").resolve().as_uri()
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        page.wait_for_load_state("load")
        imgs = page.locator("figure img")
        assert imgs.count() == 5  # 2 + 1 probe figures + fig4's 2
        for i in range(imgs.count()):
            img = imgs.nth(i)
            img.scroll_into_view_if_needed()
            assert img.evaluate("e => e.complete && e.naturalWidth > 100 && e.naturalHeight > 100")
            shot = Image.open(io.BytesIO(img.screenshot())).convert("L")
            lo, hi = shot.getextrema()
            assert hi - lo > 50, f"figure {i} painted flat"
        assert page.locator("td.failed").count() >= 1 and page.locator("script").count() == 0
        browser.close()
    assert errors == []
