import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from attnrank.checkpoint import shipped_model_path

    return shipped_model_path("minilm")


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    from .helpers import stdlib_sentences

    return stdlib_sentences(3)
