"""Progress as plain lines, for a console that is not a terminal (a log file, a pipe, CI).

A rich progress bar draws nothing when stderr is not a terminal, so a long command run with its
output redirected printed nothing for minutes. :class:`LineProgress` takes its place there: the
part of :class:`rich.progress.Progress`'s interface the commands use (``add_task``, ``update``,
a context manager), writing one line such as ``layers 4/6 (12 s)`` every ``every_s`` seconds
(:data:`EVERY_S`) at a fixed interval, from a beat that keeps going while a phase reports nothing
(loading a model, one long layer), and a last line when the task is complete. Nothing is printed
in the first ``every_s`` seconds, so a quick command (or one that fails at once with its one error
line) prints no progress at all. ``--quiet`` silences it (the commands then pass no console).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: seconds between progress lines off a terminal (a line within 10 s of the start of any long command)
EVERY_S = 5.0


class LineProgress:
    """Plain-line progress on ``console`` (anything with ``print(str, highlight=...)``)."""

    def __init__(self, console: Any, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic,
                 beat: bool | None = None, start: float | None = None):
        """``beat``: print at the fixed interval from a thread while the block runs (default: with
        the real clock; a test that drives ``clock`` by hand gets lines only from ``update``).
        ``start``: when the work began on ``clock`` (the command's start: the interval and the
        seconds shown count from there; default: entering the block)."""
        import threading

        self.console, self.every_s, self.clock, self.began = console, every_s, clock, start
        self.tasks: list[dict[str, Any]] = []
        self.start = self.last = clock() if start is None else start
        self.printed = 0
        self.current: int | None = None  # the task updated last: the one the beat reports
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = (threading.Thread(target=self._beat, name="headrank-progress", daemon=True)
                       if (clock is time.monotonic if beat is None else beat) else None)

    def __enter__(self) -> LineProgress:
        self.start = self.last = self.clock() if self.began is None else self.began
        if self.thread is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.stop.set()
        if self.thread is not None and self.thread.is_alive():
            self.thread.join()
        return False

    def _beat(self) -> None:
        """A line every ``every_s`` seconds of the task updated last, whether or not it moved."""
        while not self.stop.wait(min(0.5, self.every_s / 4)):
            with self.lock:
                now = self.clock()
                if self.current is None or now - self.last < self.every_s:
                    continue
                self.last = now
                self.printed += 1
                line = self.line(self.tasks[self.current], now)
            self.console.print(line, highlight=False)

    def add_task(self, description: str, total: float | None = None, **fields: Any) -> int:
        with self.lock:
            self.tasks.append({"description": description, "total": total, "completed": 0, "fields": dict(fields)})
            self.current = len(self.tasks) - 1
            return self.current

    def update(self, task_id: int, *, completed: float | None = None, total: float | None = None,
               advance: float | None = None, description: str | None = None, **fields: Any) -> None:
        with self.lock:
            line = self._update(task_id, completed, total, advance, description, fields)
        if line is not None:
            self.console.print(line, highlight=False)

    def _update(self, task_id: int, completed: float | None, total: float | None, advance: float | None,
                description: str | None, fields: dict[str, Any]) -> str | None:
        t = self.tasks[task_id]
        self.current = task_id
        before = (t["completed"], t["description"])
        if total is not None:
            t["total"] = total
        if completed is not None:
            t["completed"] = completed
        if advance is not None:
            t["completed"] += advance
        if description is not None:
            t["description"] = description
        t["fields"].update(fields)
        if (t["completed"], t["description"]) == before:
            return None
        now = self.clock()
        done = t["total"] is not None and t["completed"] >= t["total"]
        if now - self.last >= self.every_s or (done and self.printed):
            self.last = now
            self.printed += 1
            return self.line(t, now)
        return None

    def line(self, t: dict[str, Any], now: float) -> str:
        n = f"{t['completed']:g}" + (f"/{t['total']:g}" if t["total"] is not None else "")
        info = " ".join(str(v) for v in t["fields"].values() if v not in (None, ""))
        return f"{t['description']} {n}{'  ' + info if info else ''} ({now - self.start:.0f} s)"


class Heartbeat:
    """For a long call that reports no progress of its own (a reproduction, loading a model): a
    line ``LABEL ... (N s)`` on ``console`` every ``every_s`` seconds from a daemon thread, the
    first after ``every_s`` seconds (a quick call prints nothing); stops when the block ends.
    ``tick``, if given, is polled instead (four times per ``every_s``, at most once a second)
    and its line, when it returns one, is printed.

    The thread imports nothing and renders no markup: it writes plain text to the console's
    file (a background thread importing a library while the main thread uses it is a race)."""

    def __init__(self, console: Any, label: str, every_s: float = 30.0, tick: Any = None):
        import threading

        self.console, self.label, self.every_s, self.tick = console, label, every_s, tick
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="headrank-heartbeat", daemon=True)

    def _beat(self) -> None:
        start = time.monotonic()
        wait = min(1.0, self.every_s / 4) if self.tick is not None else self.every_s
        while not self.stop.wait(wait):
            line = (self.tick() if self.tick is not None else
                    f"{self.label} ... ({time.monotonic() - start:.0f} s)")
            if line:
                out = self.console.file
                out.write(line + "\n")
                out.flush()

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.stop.set()
        self.thread.join()
        return False
