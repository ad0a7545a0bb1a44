"""util.memory: the heap trim runs where glibc has it and is a no-op elsewhere."""

import platform

from headrank.util import memory


def test_trim_heap_runs_on_glibc_and_is_repeatable():
    ran = memory.trim_heap()
    assert ran is (platform.libc_ver()[0] == "glibc")
    assert memory.trim_heap() is ran


def test_trim_heap_without_malloc_trim_is_a_no_op(monkeypatch):
    monkeypatch.setattr(memory, "_malloc_trim", lambda: None)
    assert memory.trim_heap() is False


def test_gc_paused_collects_nothing_inside_then_freezes_and_restores():
    import gc

    before = gc.get_freeze_count()
    try:
        with memory.gc_paused():
            assert not gc.isenabled()
            made = [[i] for i in range(1000)]  # tracked objects made while paused
        assert gc.isenabled() and gc.get_freeze_count() >= before + len(made)
        gc.disable()
        with memory.gc_paused():
            pass
        assert not gc.isenabled()  # a caller's disabled collector stays disabled
    finally:
        gc.enable()
        gc.unfreeze()
