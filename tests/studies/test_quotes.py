"""Every quote a claim carries is found verbatim (whitespace aside) in a source document.

The source documents are not in the repository. They are found through ``HEADRANK_SOURCES``
(a directory of ``*.txt``), by default ``shared/seeds`` beside the clone (``REPO/../shared/seeds``;
CI lays a copy of ``shared/`` there). With the documents, every quote is checked against them
and against the committed record ``quotes_record.json`` (each quote's SHA-256, the SHA-256 of the
document it is in and its character offset there, whitespace-normalised). Without them, on a
clone anywhere else, the quotes are checked against that record only, and the document test
skips with one visible reason; ``HEADRANK_REQUIRE_SOURCES=1`` (set by ``.ci/run``) makes a
missing document a failure instead. After adding or changing a quote, with the documents at hand:

    python tests/studies/test_quotes.py --write
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pkgutil
import sys
from pathlib import Path

import pytest

import headrank.studies as studies
from headrank.studies.registry import Claim, citation_problems

REPO = Path(__file__).resolve().parents[2]
SOURCES = Path(os.path.expanduser(os.environ.get("HEADRANK_SOURCES") or REPO.parent / "shared" / "seeds"))
RECORD = Path(__file__).with_name("quotes_record.json")
REQUIRED = os.environ.get("HEADRANK_REQUIRE_SOURCES", "") not in ("", "0")


def _norm(text: str) -> str:
    return " ".join(text.split())


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _documents() -> dict[str, str]:
    """name -> whitespace-normalised text of every source document found ({} when none)."""
    files = sorted(SOURCES.glob("*.txt")) if SOURCES.is_dir() else []
    return {f.name: _norm(f.read_text(encoding="utf-8")) for f in files}


@pytest.fixture(scope="module")
def documents() -> dict[str, str]:
    docs = _documents()
    if not docs:
        why = f"the source documents are missing: no *.txt in {SOURCES} (set HEADRANK_SOURCES)"
        if REQUIRED:
            pytest.fail(why)
        pytest.skip(why + "; quotes checked against quotes_record.json only")
    return docs


def _quote_constants() -> dict[str, str]:
    """Every module-level string constant of studies/ named Q_* or *QUOTE* (the claims' quotes)."""
    out = {}
    for mod in pkgutil.walk_packages(studies.__path__, "headrank.studies."):
        m = importlib.import_module(mod.name)
        for name, value in vars(m).items():
            if isinstance(value, str) and (name.startswith("Q_") or "QUOTE" in name) and value:
                out[f"{mod.name}.{name}"] = value
    return out


def _locate(quote: str, docs: dict[str, str]) -> dict[str, object] | None:
    q = _norm(quote)
    for name, text in docs.items():
        at = text.find(q)
        if at >= 0:
            return {"quote_sha256": _sha(q), "document": name, "document_sha256": _sha(text), "offset": at}
    return None


def _record() -> dict[str, dict[str, object]]:
    return json.loads(RECORD.read_text(encoding="utf-8"))


def test_there_are_quotes_from_all_three_documents():
    quotes = _quote_constants()
    assert len(quotes) >= 25
    joined = " ".join(quotes.values())
    assert "rank reduction correlates strongly" in joined  # the paper
    assert "Skip connections help prevent rank collapse" in joined  # the collapse article
    assert "arbitrarily small weight matrix norms" in joined  # the scale article


@pytest.mark.parametrize("name", sorted(_quote_constants()))
def test_every_quote_is_verbatim_in_a_source_document(name, documents):
    quote = _quote_constants()[name]
    where = _locate(quote, documents)
    assert where is not None, f"{name} is not found verbatim in {SOURCES}: {quote!r}"
    assert _record().get(name) == where, f"{name}: quotes_record.json is stale (python {__file__} --write)"


@pytest.mark.parametrize("name", sorted(_quote_constants()))
def test_every_quote_is_in_the_committed_record(name):
    """Without the documents: the quote is the text that was found verbatim when the record was
    written (its hash), at a recorded place in a recorded document."""
    rec = _record().get(name)
    assert rec is not None, f"{name} is not in quotes_record.json (python {__file__} --write)"
    assert rec["quote_sha256"] == _sha(_norm(_quote_constants()[name])), f"{name} changed since it was recorded"
    assert isinstance(rec["offset"], int) and rec["offset"] >= 0 and len(rec["document_sha256"]) == 64


def test_the_record_names_no_quote_that_is_gone():
    assert sorted(set(_record()) - set(_quote_constants())) == []


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


if __name__ == "__main__":  # python tests/studies/test_quotes.py --write
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/studies/test_quotes.py --write")
    docs = _documents()
    if not docs:
        sys.exit(f"no *.txt in {SOURCES} (set HEADRANK_SOURCES)")
    rec, missing = {}, []
    for name, quote in sorted(_quote_constants().items()):
        where = _locate(quote, docs)
        (missing.append(name) if where is None else rec.__setitem__(name, where))
    if missing:
        sys.exit("not verbatim in any document: " + ", ".join(missing))
    RECORD.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(rec)} quotes recorded in {RECORD}")
