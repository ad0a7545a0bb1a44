"""The one-line form of an error: whitespace folded, the type for an empty message, a marked cut."""

import pytest

from headrank.errors import ONE_LINE_LIMIT, HeadRankError, one_line


def test_whitespace_and_newlines_fold_into_single_spaces():
    e = ValueError("  cannot\tread\n\n  file.bin:\r\n bad   header \n")
    assert one_line(e) == "cannot read file.bin: bad header"
    assert one_line("a\nb\t\tc ") == "a b c"


def test_an_empty_message_reads_as_the_type_name():
    assert one_line(KeyError()) == "KeyError"
    assert one_line(HeadRankError(" \n ")) == "HeadRankError"
    assert one_line("") == ""  # a string has no type to fall back on
    assert one_line(" \n ") == ""


def test_typed_prefixes_the_type_once():
    assert one_line(RuntimeError("boom\nthere"), typed=True) == "RuntimeError: boom there"
    assert one_line(RuntimeError(), typed=True) == "RuntimeError"
    assert one_line("plain", typed=True) == "plain"


@pytest.mark.parametrize("limit", [3, 5, 10, 200, ONE_LINE_LIMIT])
def test_a_long_message_is_cut_to_the_limit_with_a_marker(limit):
    words = " ".join(f"w{i}" for i in range(400))  # 1889 characters
    out = one_line(OSError(words.replace(" ", " \n ")), limit)
    assert len(out) == limit and out.endswith("...")
    assert out[:-3] == words[: limit - 3]


def test_a_message_at_the_limit_is_not_cut_and_none_never_cuts():
    assert one_line(ValueError("x" * 200), 200) == "x" * 200
    assert one_line(ValueError("x" * 201), 200) == "x" * 197 + "..."
    assert one_line(ValueError("y" * 5000), None) == "y" * 5000
    assert len(one_line(ValueError("z" * 5000))) == ONE_LINE_LIMIT


def test_a_tiny_limit_still_holds():
    assert one_line(ValueError("abcdef"), 2) == ".."
    assert one_line(ValueError("abcdef"), 0) == ""
    assert one_line(ValueError("ab"), 2) == "ab"


def test_typed_counts_the_type_within_the_limit():
    out = one_line(ValueError("v" * 100), 20, typed=True)
    assert out == "ValueError: vvvvv..." and len(out) == 20
