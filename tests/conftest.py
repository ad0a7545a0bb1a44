import os
import signal
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Started in the background by a non-interactive shell (`cmd &`, nohup), a process inherits SIGINT
# ignored, and so does every child it starts: the tests that send SIGINT to a command would then
# see it ignored, as no user at a terminal does. Each test process handles SIGINT as Python does.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _signal_state_kept(request):
    """Every test leaves the process's SIGINT handler and signal mask as it found them: a test (or a
    library it drives) that leaves SIGINT ignored, defaulted or blocked would make a later test in
    the same worker, and every child process it starts, deaf to Ctrl-C (an order-dependent
    failure). The state is put back and the test named in a warning."""
    import signal
    import threading
    import warnings

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGINT)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, []) if hasattr(signal, "pthread_sigmask") else None
    yield
    now = signal.getsignal(signal.SIGINT)
    now_mask = signal.pthread_sigmask(signal.SIG_BLOCK, []) if mask is not None else None
    if now != handler or now_mask != mask:
        signal.signal(signal.SIGINT, handler)
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        warnings.warn(f"{request.node.nodeid} left SIGINT's handler {now!r} (was {handler!r}) and the signal "
                      f"mask {sorted(now_mask or ())} (was {sorted(mask or ())}): put back", stacklevel=1)


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
