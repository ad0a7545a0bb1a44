"""The documentation site: every column the tables write is documented in docs/outputs.md, every
command has its page, and ``mkdocs build --strict`` (what ``make docs`` runs) passes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_outputs_page_lists_every_column():
    from headrank.analysis.scan import TABLE_COLUMNS
    from headrank.core.metrics import METRICS, SUMMARY_METRICS

    text = (ROOT / "docs" / "outputs.md").read_text()
    for col in (*TABLE_COLUMNS, "source", "heads", "rank_frac", *SUMMARY_METRICS):
        assert f"`{col}`" in text, col
    for m in METRICS:  # each metric's own definition, as the metric table states it
        assert m.definition.replace("|", "&#124;") in text, m.name


def test_every_command_has_a_page_with_both_sides():
    import headrank

    for verb in headrank.VERBS:
        page = (ROOT / "docs" / "verbs" / f"{verb}.md").read_text()
        assert f"headrank {verb}" in page and f"headrank.{verb}(" in page, verb


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    r = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").is_file()
