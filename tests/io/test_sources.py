"""Every kind of source gives the spectra of the equivalent saved checkpoint: live modules,
state_dicts, Hub ids in a cache laid out offline, Trainer checkpoints, run directories; and
bad input gives one line (exit 2 on the command line, nothing written)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import transformers as tf
from typer.testing import CliRunner

from headrank.analysis.scan import analyze
from headrank.cli import app
from headrank.errors import HeadRankError

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=101,
             num_key_value_heads=2)


def _llama(path=None, seed=0):
    torch.manual_seed(seed)
    m = tf.LlamaForCausalLM(tf.LlamaConfig(**SMALL)).eval()
    if path is not None:
        m.save_pretrained(path, safe_serialization=True)
    return m


def same(a, b):
    for p in ("qk", "ov"):
        np.testing.assert_array_equal(a.sv[p], b.sv[p])


# -- live objects --------------------------------------------------------------------------------
def test_live_module_and_state_dict_equal_the_saved_checkpoint(tmp_path):
    model = _llama(tmp_path / "m")
    ref = analyze(tmp_path / "m")
    live = analyze(model)
    same(live, ref)
    assert live.meta["input"] == "live" and live.meta["path"] is None and live.meta["files"] == []
    assert live.meta["live"]["class"].endswith("LlamaForCausalLM")
    sd = analyze(model.state_dict(), config=model.config.to_dict())
    same(sd, ref)
    assert sd.meta["input"] == "state_dict"
    sd2 = analyze(model.state_dict(), config=tmp_path / "m" / "config.json")
    same(sd2, ref)


def test_live_module_with_a_layout(tmp_path):
    model = _llama(tmp_path / "m")
    (tmp_path / "l.toml").write_text(
        'split = "separate"\n[tensors]\nq = "layers.{i}.self_attn.q_proj.weight"\n'
        'k = "layers.{i}.self_attn.k_proj.weight"\nv = "layers.{i}.self_attn.v_proj.weight"\n'
        'o = "layers.{i}.self_attn.o_proj.weight"\n[sizes]\nn_layers = 2\nd_model = 64\nn_heads = 4\n'
        'n_kv_heads = 2\n')
    plain = torch.nn.Sequential()
    plain.add_module("inner", model.model)  # no config: the layout says everything
    same(analyze(plain, layout=tmp_path / "l.toml"), analyze(tmp_path / "m"))


@pytest.mark.parametrize("obj", [42, "not/a/path/nor/cached", [torch.zeros(2)], {"a": 1}, {}])
def test_not_a_model(obj, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(HeadRankError) as e:
        analyze(obj)
    assert "\n" not in str(e.value)


def test_module_without_config_or_state_dict_without_config():
    with pytest.raises(HeadRankError, match="pass config="):
        analyze(torch.nn.Linear(3, 3))
    with pytest.raises(HeadRankError, match="pass config="):
        analyze({"w": torch.zeros(2)})


# -- Hugging Face cache ids -------------------------------------------------------------------------
def lay_out_cache(cache, repo_id, src, commit, ref="main"):
    """huggingface_hub's cache layout: models--org--name/{refs/REF, snapshots/COMMIT/...}."""
    root = cache / ("models--" + repo_id.replace("/", "--"))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    shutil.copytree(src, root / "snapshots" / commit)
    return root


def test_hub_id_from_the_cache(tmp_path, monkeypatch):
    _llama(tmp_path / "a", seed=0)
    _llama(tmp_path / "b", seed=1)
    cache = tmp_path / "hf" / "hub"
    lay_out_cache(cache, "org/tiny", tmp_path / "a", "a" * 40)
    lay_out_cache(cache, "org/tiny", tmp_path / "b", "b" * 40, ref="v1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    res = analyze("org/tiny")
    same(res, analyze(tmp_path / "a"))
    assert res.meta["input"] == "hub" and res.meta["hub"]["commit"] == "a" * 40
    same(analyze("org/tiny", revision="v1"), analyze(tmp_path / "b"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))  # HF_HUB_CACHE wins over HF_HOME
    monkeypatch.setenv("HF_HOME", str(tmp_path / "elsewhere"))
    same(analyze("org/tiny"), analyze(tmp_path / "a"))


def test_uncached_id_names_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HeadRankError, match="not in the Hugging Face cache.*hf download org/none --include"):
        analyze("org/none")
    with pytest.raises(HeadRankError, match="network is off"):
        analyze("org/none", download=True)
    res = CliRunner().invoke(app, ["spectra", "gpt2", "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "hf download gpt2" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_revision_needs_a_hub_id(tmp_path):
    _llama(tmp_path / "m")
    with pytest.raises(HeadRankError, match="`revision` applies"):
        analyze(tmp_path / "m", revision="main")


# -- Trainer checkpoints and run directories --------------------------------------------------------
@pytest.mark.parametrize("safe", [True, False])
def test_trainer_checkpoint_reads_only_the_model(tmp_path, safe):
    model = _llama()
    out = tmp_path / "trainer"
    for step in (5, 10):
        ck = out / f"checkpoint-{step}"
        model.save_pretrained(ck)
        if not safe:  # transformers 5 writes safetensors only: make the older pytorch_model.bin
            (ck / "model.safetensors").unlink()
            torch.save({k: v.clone() for k, v in model.state_dict().items()}, ck / "pytorch_model.bin")
        torch.save({"state": {0: {"step": 3}}, "param_groups": [{"lr": 0.1}]}, ck / "optimizer.pt")
        (ck / "training_args.bin").write_bytes(b"\x80\x04not a tensor file")
        torch.save({"python": [1, 2, 3]}, ck / "rng_state.pth")
        (ck / "scheduler.pt").write_bytes(b"junk")
        (ck / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    ref = analyze(out / "checkpoint-5")
    assert ref.meta["input"] == "trainer" and ref.meta["files"] == [
        "model.safetensors" if safe else "pytorch_model.bin"]
    assert "optimizer.pt" in ref.meta["ignored_files"]
    top = analyze(out)  # the output_dir: its highest checkpoint-N
    assert top.meta["path"].endswith("checkpoint-10")
    same(top, ref)


def test_run_directory(tmp_path):
    _llama(tmp_path / "m")
    step = tmp_path / "run" / "checkpoints" / "step-00000020"
    shutil.copytree(tmp_path / "m", step)
    (step / "state.pt").write_bytes(b"")
    res = analyze(tmp_path / "run")
    assert res.meta["input"] == "run" and res.meta["path"].endswith("step-00000020")
    same(res, analyze(tmp_path / "m"))
    out = CliRunner().invoke(app, ["spectra", str(tmp_path / "run"), "-q"])
    assert out.exit_code == 0, out.output


# -- command line ---------------------------------------------------------------------------------
def test_format_csv_prints_the_per_head_table(tmp_path):
    _llama(tmp_path / "m")
    res = CliRunner().invoke(app, ["spectra", str(tmp_path / "m"), "--format", "csv"])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[0].startswith("layer,head,kv_head,product,sv_max")
    assert len(lines) == 1 + 2 * 4 * 2  # layers × heads × products
    assert lines[0].endswith(",source") and lines[1].endswith(str(tmp_path / "m"))  # the columns of heads.csv


def test_version():
    from headrank.util.env import __version__

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"headrank {__version__}"


def test_result_save_and_top_level_exports(tmp_path):
    import headrank

    _llama(tmp_path / "m")
    r = headrank.analyze(tmp_path / "m", layers="0")
    written = r.save(tmp_path / "o", plots=False)
    # a llama is rotary: its per-band QK table comes with the set
    assert {p.name for p in written} == {"heads.csv", "summary.csv", "spectra.npz", "meta.json", "rotary.csv"}
    assert json.loads((tmp_path / "o" / "meta.json").read_text())["input"] == "directory"
    assert callable(headrank.save) and callable(headrank.param_groups) and headrank.RankTracker


def test_importing_headrank_is_light():
    import subprocess
    import sys

    code = ("import sys, headrank, headrank.cli; "
            "print(sorted(m for m in ('torch', 'pandas', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_factored_output_with_a_foreign_manifest_is_refused_in_one_line(tmp_path):
    """A factored.json that is not headrank's is refused before any weight is read (a real one is
    read at its uncut shapes: tests/io/test_factored.py)."""
    from headrank.io.sources import open_reader

    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "factored.json").write_text("{}")
    with pytest.raises(HeadRankError, match="factored.json: not a headrank factored manifest"):
        open_reader(str(tmp_path))
