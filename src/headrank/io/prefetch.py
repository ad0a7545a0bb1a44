"""The one layer-prefetch loop: :meth:`headrank.io.layouts.AttentionReader.stream`.

The caller works on layer i while one reader thread reads layer i+1, so the disk (or the
network) and the arithmetic overlap, and no more than two layers are held: the one the caller
has and the one being read (the caller drops its layer at the end of its loop body). The
reader thread reads a layer only when asked, after the caller has taken the previous one, so
the checkpoint is touched by one thread at a time; between reads the caller's thread releases
what the read mapped (``ckpt.release()``) and gives the freed heap back
(:func:`headrank.util.memory.trim_heap`).

- The first layer is read in the caller's thread: whatever the read path imports (a dtype's
  converter, a quantization library) is imported there, never by the reader thread while the
  caller uses it (a half-imported module is a race).
- What a read raises reaches the caller as the same exception (a
  :class:`~headrank.errors.HeadRankError` stays that one line), when the caller asks for
  that layer.
- An early exit (``break``, an error or Ctrl-C in the caller's loop, :meth:`LayerStream.close`,
  leaving its ``with`` block) stops the reader thread and joins it, after at most the one read
  it has in hand, whose layer is dropped.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

_STOP = object()


class LayerStream:
    """``(i, read(i))`` for each layer ``i`` of ``layers`` in order (see the module docstring).

    An iterator, and a context manager that stops the reader thread on leaving the block:
    ``with reader.stream(layers) as s: for i, hw in s: ...``; a stream dropped unfinished stops
    it too (neither the thread nor the loop refers back to the stream). ``waited``: seconds the
    caller spent waiting for a layer to be read."""

    def __init__(self, reader: Any, layers: Iterable[int], read: Callable[[int], Any]):
        self._waited = [0.0]
        self._gen = _stream(reader.ckpt, list(layers), read, self._waited)

    @property
    def waited(self) -> float:
        return self._waited[0]

    def __iter__(self) -> LayerStream:
        return self

    def __next__(self) -> tuple[int, Any]:
        return next(self._gen)

    def __enter__(self) -> LayerStream:
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.close()
        return False

    def close(self) -> None:
        """Stop and join the reader thread (what it read is dropped); a finished stream: nothing."""
        self._gen.close()


def _serve(ask: queue.Queue, got: queue.Queue, read: Callable[[int], Any]) -> None:
    """The reader thread: read each layer asked for, hand it (or what the read raised) over."""
    while (i := ask.get()) is not _STOP:
        try:
            item = read(i)
        except BaseException as e:  # noqa: BLE001 - handed to the caller, who raises it
            got.put((None, e))
            return
        got.put((item, None))
        del item


def _stream(ckpt: Any, layers: list[int], read: Callable[[int], Any], waited: list[float]
            ) -> Iterator[tuple[int, Any]]:
    from headrank.util.memory import trim_heap  # imported here, in the caller's thread

    if not layers:
        return
    item = read(layers[0])  # in the caller's thread: what the read path imports, it imports here
    ask: queue.Queue = queue.Queue(maxsize=1)  # the next layer to read, or _STOP
    got: queue.Queue = queue.Queue(maxsize=1)  # (what was read, what the read raised)
    thread = threading.Thread(target=_serve, args=(ask, got, read), name="headrank-read", daemon=True)
    thread.start()
    try:
        for k, i in enumerate(layers):
            if k:
                t0 = time.perf_counter()
                item, err = got.get()
                waited[0] += time.perf_counter() - t0
                if err is not None:
                    raise err
            ckpt.release()  # unmap what the read touched (tensors read are copies)
            trim_heap()  # the previous layer's temporaries, back to the OS (resident set stays flat)
            if k + 1 < len(layers):
                ask.put(layers[k + 1])
            yield i, item
            item = None
    finally:
        _stop(thread, ask, got)


def _stop(thread: threading.Thread, ask: queue.Queue, got: queue.Queue) -> None:
    """Ask the reader thread to stop (a layer asked for and not yet picked up is not read), join
    it after the read in hand, and drop what it read."""
    try:
        ask.get_nowait()
    except queue.Empty:
        pass
    ask.put(_STOP)  # only the caller's thread puts: there is room now
    thread.join()  # the thread never waits on `got`: it holds one entry, taken before the next ask
    while not got.empty():
        got.get_nowait()
