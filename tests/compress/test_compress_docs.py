"""docs/compress.md's examples run as printed, each in its own process, in one fresh directory
whose name holds a space (docs/run_examples.py, the runner ``make doc-examples`` uses): here the
MiniLM examples (the quick start, ``load_compressed`` from another interpreter, the Python
section). The SmolLM2 examples (1 to 50 minutes each) run with ``make doc-examples``; their last
record is docs/compress_examples.json."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
_spec = importlib.util.spec_from_file_location("run_examples", DOCS / "run_examples.py")
run_examples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_examples)
PAGE = DOCS / "compress.md"


def test_every_example_is_minilm_or_smollm2_and_the_page_has_the_python_section():
    found = run_examples.examples(PAGE)
    assert found[0][0] == "console" and found[0][1].startswith("headrank compress minilm")
    assert any(k == "python" and "res = compress(" in t for k, t in found)
    # every example runs on a shipped model (nothing the reader must supply, such as a $G)
    assert all("minilm" in t or "smollm2" in t for _, t in found if "compress" in t), found
    assert not any("$" in t.replace("$ ", "") for k, t in found if k == "console")


def test_the_record_of_the_smollm2_examples_is_all_green():
    rec = json.loads((DOCS / "compress_examples.json").read_text())
    smol = [t for _, t in run_examples.examples(PAGE) if "smollm2" in t]
    assert [e["example"] for e in rec["examples"]] == [t.strip() for _, t in run_examples.examples(PAGE)], \
        "the page changed since docs/compress_examples.json was recorded: run make doc-examples"
    assert smol and all(e["ok"] for e in rec["examples"]), [e for e in rec["examples"] if not e["ok"]]


@pytest.mark.slow
def test_the_minilm_examples_run_as_printed(tmp_path):
    work = tmp_path / "a reader's dir"
    work.mkdir()
    done = run_examples.run_page(PAGE, work, skip=("smollm2",), timeout=600)
    assert len(done) >= 3 and all(d["ok"] for d in done), [d for d in done if not d["ok"]]
    assert (work / "minilm-ov50" / "compress.json").is_file()
    assert (work / "k.png").is_file() and (work / "out" / "compress.json").is_file()
