import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from headrank.io.checkpoint import shipped_model_path

    return shipped_model_path("minilm")


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    """Real English: the first three test-split sentences of the stdlib corpus."""
    from headrank.models.corpus import sentences as corpus_sentences

    return corpus_sentences("test", 3)


@pytest.fixture
def quick_figures(monkeypatch):
    """For the figure tests: no ``Figure.tight_layout`` (it moves the layout only, and is about 90 %
    of a figure's drawing time), and every figure closed afterwards."""
    import matplotlib.pyplot as plt

    from tests.figcheck import without_layout

    without_layout(monkeypatch)
    yield
    plt.close("all")
