"""The standard-library text corpus: file list, split rule, extraction, determinism."""

import hashlib
import textwrap

import pytest

from headrank.errors import HeadRankError
from headrank.models import corpus


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
    with pytest.raises(HeadRankError, match="unknown split"):
        corpus.sentences("dev")
    with pytest.raises(HeadRankError):
        corpus.sentences("train", -1)


# -- issue 27: corpora that would hang or blow up memory -----------------------------------------
def _zst(path, data: bytes) -> None:
    import zstandard

    path.write_bytes(zstandard.ZstdCompressor(level=19).compress(data))


def test_a_zstd_bomb_is_refused_before_it_is_inflated(tmp_path, monkeypatch):
    """A few KB that decompress to 100 MB (over 1000x): refused within the first MiB beyond the cap."""
    import tracemalloc

    import zstandard

    from headrank.models import data

    chunk = (b'{"text": "' + b"a" * 1000 + b'"}\n') * 1000  # 1 MB of JSON lines
    bomb = tmp_path / "bomb.jsonl.zst"
    c = zstandard.ZstdCompressor(level=1).compressobj()
    bomb.write_bytes(b"".join(c.compress(chunk) for _ in range(100)) + c.flush())  # 100 MB inflated
    assert bomb.stat().st_size < 100_000
    tracemalloc.start()
    with pytest.raises(HeadRankError, match=r"bomb.jsonl.zst: its \d+ compressed bytes decompress to more than"):
        data.read_file_documents(bomb)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 200 << 20  # the cap, not the 300 MB
    ok = tmp_path / "ok.jsonl.zst"  # ordinary text: read whole
    _zst(ok, b"".join(b'{"text": "document %d about something"}\n' % i for i in range(1000)))
    assert len(data.read_file_documents(ok)) == 1000
    monkeypatch.setattr(data, "corpus_limit", lambda: 1000)  # more text than the machine can tokenise
    with pytest.raises(HeadRankError, match="more than this machine can tokenise"):
        data.read_file_documents(ok)


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "dir_fifo"])
def test_a_corpus_that_is_not_a_regular_file(tmp_path, kind):
    import os
    import signal

    from headrank.models import data

    def boom(*_):
        raise RuntimeError("hung")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(20)
    try:
        target = tmp_path / "c.txt"
        if kind == "dev_zero":
            target.symlink_to("/dev/zero")
        else:
            os.mkfifo(target)
        if kind == "dir_fifo":  # inside a directory: skipped, never opened
            (tmp_path / "real.txt").write_text("\n\n".join(f"document {i} with words" for i in range(60)))
            assert data.corpus_files(tmp_path)[1] == ["real.txt"]
            with pytest.raises(HeadRankError, match="not a regular file"):
                data.read_file_documents(target)
        else:
            with pytest.raises(HeadRankError, match=r"c.txt is not a regular file \(a (FIFO|character device)\)"):
                data.text_splits(str(target))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_stdlib_style_root_with_a_fifo_and_a_dev_zero_link(fake_root):
    import os

    os.mkfifo(fake_root / "pipe.py")
    (fake_root / "zero.py").symlink_to("/dev/zero")
    assert corpus.blocks(None, root=fake_root)  # the real files still give blocks; nothing hangs


def test_crlf_text_reads_as_before(tmp_path):
    from headrank.models import data

    (tmp_path / "a.txt").write_bytes(b"first line\r\nsame doc\r\n\r\nsecond doc\rwith a CR\n")
    assert data.read_file_documents(tmp_path / "a.txt") == ["first line\nsame doc", "second doc\nwith a CR"]


def test_bpe_vocab_is_bounded():
    from headrank.models.data import MAX_BPE_VOCAB, LMTaskConfig

    with pytest.raises(HeadRankError, match=f"bpe_vocab must be at most {MAX_BPE_VOCAB}, got 1000000000"):
        LMTaskConfig(tokenizer="bpe", bpe_vocab=1_000_000_000)
    assert LMTaskConfig(tokenizer="bpe", bpe_vocab=MAX_BPE_VOCAB).vocab_size == MAX_BPE_VOCAB


def test_a_corpus_link_to_a_kernel_file_is_refused_before_reading(tmp_path):
    """/proc/self/pagemap says it is a regular file of 0 bytes and yields gigabytes: refused at once."""
    import os

    from headrank.models import data

    if not os.path.exists("/proc/self/pagemap"):
        pytest.skip("no /proc on this system")
    (tmp_path / "real.txt").write_text("\n\n".join(f"document {i} with words" for i in range(60)))
    (tmp_path / "pagemap.txt").symlink_to("/proc/self/pagemap")
    with pytest.raises(HeadRankError, match="pagemap.txt is a file of the kernel's proc file system"):
        data.read_corpus(tmp_path)
