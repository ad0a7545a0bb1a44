"""The standard-library text corpus: file list, split rule, extraction, determinism."""

import hashlib
import textwrap

import pytest

from attnrank.errors import AttnRankError
from attnrank.models import corpus


@pytest.fixture()
def fake_root(tmp_path):
    files = {
        "a.py": '''\
            #!/usr/bin/env python3
            # -*- coding: utf-8 -*-
            """Module docstring of the first file with enough words in it.

            A second paragraph that explains the module in a full sentence. Another sentence follows here.

                indented_code(x) for a code paragraph that must be dropped entirely
            >>> doctest line that is not prose at all
            """

            # A comment block that spans lines and
            # continues on the next line to make a sentence.
            def f():
                """Return the value after a short computation on the input."""
                return 1  # noqa: E501
            ''',
        "pkg/b.py": '"""Second file docstring with a handful of plain words inside."""\n',
        "pkg/__init__.py": "",
        "test/c.py": '"""Excluded test file docstring that should never be read."""\n',
        "site-packages/d.py": '"""Excluded third-party docstring that should never be read."""\n',
        "bad.py": "def broken(:\n    pass\n",
        "notes.txt": "Not a python file at all, so it is ignored by the corpus.\n",
    }
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return tmp_path


def test_files_sorted_relative_and_excluding_tests(fake_root):
    assert corpus.files(None, fake_root) == ["a.py", "bad.py", "pkg/__init__.py", "pkg/b.py"]


def test_split_rule_is_sha256_of_relative_path():
    for rel in ["os.py", "json/decoder.py", "email/mime/text.py", "x" * 50 + ".py"]:
        bucket = int(hashlib.sha256(rel.encode()).hexdigest()[:16], 16) % 1000
        expected = "train" if bucket < 800 else "validation" if bucket < 900 else "test"
        assert corpus.split_of(rel) == expected


def test_splits_partition_the_stdlib_files():
    allf = corpus.files(None)
    parts = {s: corpus.files(s) for s in corpus.SPLITS}
    assert sorted(sum(parts.values(), [])) == sorted(allf) == allf
    assert all(set(parts[a]).isdisjoint(parts[b]) for a in parts for b in parts if a != b)
    assert len(allf) > 300 and "os.py" in allf
    assert not any(p.startswith(("test/", "site-packages/")) or "/tests/" in p for p in allf)
    frac = len(parts["train"]) / len(allf)
    assert 0.7 < frac < 0.9, frac  # 80/10/10 by hash: a binomial draw over hundreds of files
    d = corpus.describe()
    assert d["n_files"] == len(allf) and sum(d["files_per_split"].values()) == len(allf)


def test_blocks_docstrings_and_comments_in_source_order(fake_root):
    b = corpus.blocks(None, root=fake_root)
    assert b[0].startswith("Module docstring of the first file")
    assert b[1] == "A comment block that spans lines and\ncontinues on the next line to make a sentence."
    assert b[2] == "Return the value after a short computation on the input."
    assert b[3] == "Second file docstring with a handful of plain words inside."
    assert len(b) == 4  # shebang, coding line, noqa pragma, broken file, excluded dirs: nothing
    assert not any("Excluded" in x for x in b)


def test_sentences_drop_code_and_follow_the_rules(fake_root):
    s = corpus.sentences(None, root=fake_root, min_words=5)
    assert s == [
        "Module docstring of the first file with enough words in it.",
        "A second paragraph that explains the module in a full sentence.",
        # "Another sentence follows here." has 4 words < min_words; the indented and doctest
        # paragraph is code
        "A comment block that spans lines and continues on the next line to make a sentence.",
        "Return the value after a short computation on the input.",
        "Second file docstring with a handful of plain words inside.",
    ]
    assert corpus.sentences(None, 2, root=fake_root, min_words=5) == s[:2]
    assert "Another sentence follows here." in corpus.sentences(None, root=fake_root, min_words=4)


def test_split_sentences_rules():
    text = ("First sentence has exactly six words. second starts lowercase so it stays attached. "
            "Numbers 1 2 3 4 5 6 7 8 9 10 11 12 dominate this line!\n\n    code = 1 + 2 in an indented line here.")
    out = corpus.split_sentences(text, min_words=6)
    assert out == ["First sentence has exactly six words. second starts lowercase so it stays attached."]


def test_lines_and_text(fake_root):
    lines = corpus.lines(None, root=fake_root)
    assert lines[0] == "Module docstring of the first file with enough words in it."
    assert all(ln == ln.strip() and ln for ln in lines)
    assert corpus.lines(None, 3, root=fake_root) == lines[:3]
    t = corpus.text(None, root=fake_root)
    assert t.startswith("Module docstring") and "\n\n" in t
    assert corpus.text(None, max_chars=20, root=fake_root) == t[:20]


def test_stdlib_sentences_deterministic_and_from_their_split():
    a = corpus.sentences("test", 25)
    corpus._file_blocks.cache_clear()
    b = corpus.sentences("test", 25)
    assert a == b and len(a) == 25
    for s in a:
        assert s[0].isupper() and s[-1] in ".!?" and 6 <= len(s.split()) <= 64
    test_text = " ".join(corpus.text("test").split())
    assert all(x in test_text for x in a)
    train_text = " ".join(corpus.text("train", max_chars=200_000).split())
    assert sum(x in train_text for x in a) < len(a)  # another split's files hold other text


def test_bad_split_is_a_user_error():
    with pytest.raises(AttnRankError, match="unknown split"):
        corpus.sentences("dev")
    with pytest.raises(AttnRankError):
        corpus.sentences("train", -1)
