"""util.memory: the heap trim runs where glibc has it and is a no-op elsewhere."""

import platform

from attnrank.util import memory


def test_trim_heap_runs_on_glibc_and_is_repeatable():
    ran = memory.trim_heap()
    assert ran is (platform.libc_ver()[0] == "glibc")
    assert memory.trim_heap() is ran


def test_trim_heap_without_malloc_trim_is_a_no_op(monkeypatch):
    monkeypatch.setattr(memory, "_malloc_trim", lambda: None)
    assert memory.trim_heap() is False
