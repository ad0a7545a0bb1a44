"""Every quote a claim carries is found verbatim (whitespace aside) in a source document.

The source documents are not in the repository: they sit in ``shared/seeds/`` beside the clone
(``Path(repo)/../shared/seeds``; CI lays a copy of ``shared/`` there). The test fails, never skips,
when they are missing.
"""

import importlib
import pkgutil
from pathlib import Path

import pytest

import attnrank.studies as studies
from attnrank.studies.registry import Claim, citation_problems

SEEDS = Path(__file__).resolve().parents[2].parent / "shared" / "seeds"


def _norm(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def documents() -> str:
    files = sorted(SEEDS.glob("*.txt"))
    assert files, f"the source documents are missing: no *.txt in {SEEDS}"
    return "\n".join(_norm(f.read_text(encoding="utf-8")) for f in files)


def _quote_constants() -> dict[str, str]:
    """Every module-level string constant of studies/ named Q_* or *QUOTE* (the claims' quotes)."""
    out = {}
    for mod in pkgutil.walk_packages(studies.__path__, "attnrank.studies."):
        m = importlib.import_module(mod.name)
        for name, value in vars(m).items():
            if isinstance(value, str) and (name.startswith("Q_") or "QUOTE" in name) and value:
                out[f"{mod.name}.{name}"] = value
    return out


def test_there_are_quotes_from_all_three_documents(documents):
    quotes = _quote_constants()
    assert len(quotes) >= 25
    joined = " ".join(quotes.values())
    assert "rank reduction correlates strongly" in joined  # the paper
    assert "Skip connections help prevent rank collapse" in joined  # the collapse article
    assert "arbitrarily small weight matrix norms" in joined  # the scale article


@pytest.mark.parametrize("name", sorted(_quote_constants()))
def test_every_quote_is_verbatim_in_a_source_document(name, documents):
    quote = _quote_constants()[name]
    assert _norm(quote) in documents, f"{name} is not found verbatim in {SEEDS}: {quote!r}"


def _claim(**kw):
    base = dict(name="x.y", source="paper, Figure 2 caption", statement="s", measured=1, expected=1, held=True,
                quote="Qualitative findings", rule="r")
    return Claim(**{**base, **kw})


def test_citation_problems_catch_what_a_referee_would():
    assert citation_problems([_claim().to_json()]) == []
    assert "no quote" in citation_problems([_claim(quote="").to_json()])[0]
    assert "no rule" in citation_problems([_claim(rule="").to_json()])[0]
    assert "issue" in citation_problems([_claim(source="issue 5").to_json()])[0]
    assert "supports" in citation_problems([_claim(supports="x.missing").to_json()])[0]
    # a check and an identity need no quote: they are ours
    assert citation_problems([_claim(kind="check", quote="").to_json(), _claim(kind="identity", quote="").to_json()]) == []
