"""Corpus readers (.txt, .jsonl, .jsonl.zst), split rule, tokenisers, token stream, images."""

import json

import numpy as np
import pytest
import torch
import zstandard

from headrank.errors import HeadRankError
from headrank.models import corpus
from headrank.models.data import (
    BPETokenizer,
    ByteTokenizer,
    ImageStream,
    LMTaskConfig,
    TokenStream,
    evaluate_lm,
    lm_tokens,
    load_images,
    read_corpus,
    read_file_documents,
    text_splits,
)

DOCS = [f"Document number {i} says something different: {'é' * (i % 3)} word{i} " * 3 for i in range(60)]


def _write_jsonl(path, docs, extra=None):
    with open(path, "w", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps({"text": d, "meta": {"pile_set_name": "x"}, **(extra or {})}) + "\n")


def test_jsonl_zst_and_txt_give_the_same_documents(tmp_path):
    _write_jsonl(tmp_path / "a.jsonl", DOCS)
    raw = (tmp_path / "a.jsonl").read_bytes()
    (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(raw))
    (tmp_path / "c.txt").write_text("\n\n".join(DOCS) + "\n", encoding="utf-8")
    a = read_file_documents(tmp_path / "a.jsonl")
    b = read_file_documents(tmp_path / "b.jsonl.zst")
    c = read_file_documents(tmp_path / "c.txt")
    assert a == b == DOCS
    assert c == [d.strip() for d in DOCS]


def test_zst_written_as_a_stream_of_frames_is_read_whole(tmp_path):
    """The Pile's files are written by a streaming compressor (no content size in the header)."""
    p = tmp_path / "s.jsonl.zst"
    with open(p, "wb") as fh, zstandard.ZstdCompressor().stream_writer(fh) as w:
        for d in DOCS:
            w.write((json.dumps({"text": d}) + "\n").encode())
    assert read_file_documents(p) == DOCS


def test_split_is_by_document_hash_and_covers_every_document_once(tmp_path):
    _write_jsonl(tmp_path / "a.jsonl", DOCS)
    parts = {s: read_corpus(tmp_path / "a.jsonl", s) for s in corpus.SPLITS}
    assert sorted(sum(parts.values(), [])) == sorted(DOCS)
    expected = {s: [d for i, d in enumerate(DOCS) if corpus.split_of(f"a.jsonl#{i}") == s] for s in corpus.SPLITS}
    assert parts == expected
    # a directory: same documents, keyed by relative path
    (tmp_path / "sub").mkdir()
    _write_jsonl(tmp_path / "sub" / "z.jsonl", DOCS[:5])
    all_docs = read_corpus(tmp_path, None)
    assert all_docs == DOCS + DOCS[:5]


def test_text_splits_of_a_user_corpus(tmp_path):
    _write_jsonl(tmp_path / "a.jsonl", DOCS)
    t = text_splits(str(tmp_path / "a.jsonl"))
    assert set(t) == set(corpus.SPLITS) and all(t[s] for s in corpus.SPLITS)
    assert t["train"].startswith(read_corpus(tmp_path / "a.jsonl", "train")[0])
    short = text_splits(str(tmp_path / "a.jsonl"), 50)
    assert all(len(v) == 50 for v in short.values())


@pytest.mark.parametrize("content, message", [
    ('{"text": "ok"}\n{"txt": "no text field"}\n', "line 2 has no string field 'text'"),
    ('{"text": "ok"}\nnot json\n', "line 2 is not JSON"),
    ('{"text": 5}\n', "line 1 has no string field"),
])
def test_bad_jsonl_lines_are_user_errors(tmp_path, content, message):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(HeadRankError, match=message):
        read_file_documents(p)


def test_bad_corpus_paths_are_user_errors(tmp_path):
    (tmp_path / "corrupt.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd garbage that is not a frame")
    (tmp_path / "x.csv").write_text("a,b\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "one.jsonl").write_text('{"text": "a single short document"}\n')
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(HeadRankError, match="corrupt Zstandard|cannot read"):
        read_file_documents(tmp_path / "corrupt.jsonl.zst")
    with pytest.raises(HeadRankError, match="unsupported"):
        text_splits(str(tmp_path / "x.csv"))
    with pytest.raises(HeadRankError, match="no such file"):
        text_splits(str(tmp_path / "missing.jsonl"))
    with pytest.raises(HeadRankError, match="no .txt"):
        text_splits(str(tmp_path / "empty"))
    with pytest.raises(HeadRankError, match="no text in the"):
        text_splits(str(tmp_path / "one.jsonl"))
    with pytest.raises(HeadRankError, match="not UTF-8"):
        read_file_documents(tmp_path / "latin1.txt")
    with pytest.raises(HeadRankError, match="no such file"):
        LMTaskConfig(corpus=str(tmp_path / "nope"))
    with pytest.raises(HeadRankError, match="tokenizer"):
        LMTaskConfig(tokenizer="words")


def test_stdlib_corpus_is_the_default_and_is_corpus_text():
    t = text_splits(None, 20000)
    for s in corpus.SPLITS:
        assert t[s] == corpus.text(s, max_chars=20000)


def test_byte_tokenizer_round_trip_and_lm_tokens():
    tok = ByteTokenizer()
    s = "Grüße, λ = 0.1\n\nnext"
    ids = tok.encode(s)
    assert ids.dtype == np.int64 and ids.max() < 256 and tok.decode(ids) == s
    tokens, t = lm_tokens(LMTaskConfig(max_chars=5000, seq_len=16))
    assert t.vocab_size == 256 and tokens["train"].numel() >= 5000
    assert tok.decode(tokens["validation"][:200].tolist()) == corpus.text("validation", max_chars=5000)[:200]


def test_bpe_is_trained_on_train_only_saved_and_reloaded(tmp_path):
    cfg = LMTaskConfig(tokenizer="bpe", bpe_vocab=400, max_chars=40000, seq_len=16)
    tokens, tok = lm_tokens(cfg, tmp_path)
    assert (tmp_path / "tokenizer.json").exists()
    assert 256 < tok.vocab_size <= 400
    assert int(tokens["train"].max()) < tok.vocab_size
    # BPE compresses: fewer tokens than bytes
    assert tokens["train"].numel() < 0.8 * len(text_splits(None, 40000)["train"].encode())
    text = "Return the value of the attribute."
    assert tok.decode(tok.encode(text)) == text
    again, tok2 = lm_tokens(cfg, tmp_path)  # read back from the run directory
    assert torch.equal(again["test"], tokens["test"])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{not json")
    with pytest.raises(HeadRankError, match="cannot read tokenizer"):
        BPETokenizer.load(bad / "tokenizer.json")


def test_token_stream_is_seeded_resumable_and_shifted():
    toks = torch.arange(1000)
    a = TokenStream(toks, 8, 4, seed=3)
    x, y = a.next()
    assert x.shape == (4, 8) and torch.equal(y, x + 1)
    state = a.state_dict()
    nxt = a.next()
    b = TokenStream(toks, 8, 4, seed=3)
    b.load_state_dict(state)
    assert all(torch.equal(u, v) for u, v in zip(b.next(), nxt, strict=True))
    with pytest.raises(HeadRankError):
        TokenStream(toks, 8, 5, seed=3).load_state_dict(state)


def test_evaluate_lm_on_a_known_model():
    """A model that outputs uniform logits has loss log V and perplexity V exactly."""

    class Uniform(torch.nn.Module):
        def forward(self, idx):
            return torch.zeros(*idx.shape, 50)

    r = evaluate_lm(Uniform(), torch.randint(0, 50, (1001,)), seq_len=10, max_tokens=500, device=torch.device("cpu"))
    assert r["tokens"] == 500
    assert r["loss"] == pytest.approx(np.log(50), rel=1e-6) and r["ppl"] == pytest.approx(50, rel=1e-5)  # float32 logits


def test_digits_default_and_image_folder(tmp_path):
    from PIL import Image

    d = load_images(None, None)
    assert d.channels == 1 and d.image_size == 8 and len(d.classes) == 10
    assert sum(v[1].numel() for v in d.splits.values()) == 1797
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / "f" / cls).mkdir(parents=True)
        for i in range(30):
            arr = rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)
            Image.fromarray(arr).save(tmp_path / "f" / cls / f"{i}.png")
    f = load_images(str(tmp_path / "f"), 16)
    assert f.classes == ["cat", "dog"] and f.channels == 3 and f.image_size == 16
    assert sum(v[1].numel() for v in f.splits.values()) == 60
    x, y = f.splits["train"]
    assert x.shape[1:] == (3, 16, 16) and x.min() >= -0.5 and x.max() <= 0.5
    s = ImageStream(f.splits["train"], 5, seed=0)
    xb, yb = s.next()
    assert xb.shape == (5, 3, 16, 16) and set(yb.tolist()) <= {0, 1}
    (tmp_path / "f" / "dog" / "broken.png").write_bytes(b"not an image")
    with pytest.raises(HeadRankError, match="cannot read"):
        load_images(str(tmp_path / "f"), 17)
    (tmp_path / "g").mkdir()
    with pytest.raises(HeadRankError, match="no images"):
        load_images(str(tmp_path / "g"), 8)


# -- issue 27: images that would blow up memory ---------------------------------------------------
def tiny_png_declaring(w: int, h: int) -> bytes:
    """A valid PNG header declaring w x h grey pixels, with almost no data (66 bytes)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b""))


def test_a_png_declaring_20000_squared_is_refused_as_a_bomb(tmp_path):
    from headrank.models.data import ImageTaskConfig, load_images

    for split in ("train", "validation", "test"):
        for c in ("a", "b"):
            (tmp_path / split / c).mkdir(parents=True)
            (tmp_path / split / c / "ok.png").write_bytes(tiny_png_declaring(4, 4))
    bomb = tmp_path / "train" / "a" / "bomb.png"
    bomb.write_bytes(tiny_png_declaring(20000, 20000))
    assert len(bomb.read_bytes()) < 70  # the red team's was 69 bytes
    with pytest.raises(HeadRankError, match="bomb.png declares more pixels than Pillow decodes safely"):
        load_images(str(ImageTaskConfig(images=str(tmp_path)).images), 8)
    bomb.write_bytes(tiny_png_declaring(10000, 10000))  # over Pillow's limit but under twice it: a warning
    with pytest.raises(HeadRankError, match="refused as a decompression bomb"):
        load_images(str(ImageTaskConfig(images=str(tmp_path)).images), 9)


def test_image_size_checked_against_memory_before_resizing():
    from headrank.models.data import load_images

    with pytest.raises(HeadRankError, match=r"`image_size` 100000: 1797 images of 100000x100000 pixels would need"):
        load_images(None, 100000)
