"""The collector pause: back on after the last pause, its objects promoted unscanned."""

from __future__ import annotations

import gc
import weakref

from toast_core.gcpause import gc_paused


class _Node:
    """A container the collector tracks."""

    def __init__(self) -> None:
        self.next = None


def _in_generation(obj, generation: int) -> bool:
    return any(o is obj for o in gc.get_objects(generation))


def test_pause_disables_then_restores_the_collector():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # an inner pause ending does not turn it back on
    assert gc.isenabled()


def test_objects_made_during_a_pause_end_in_the_oldest_generation():
    with gc_paused():
        kept = _Node()
        assert _in_generation(kept, 0)
    assert _in_generation(kept, 2)
    assert gc.get_count()[0] < 700  # nothing owed to the next young collection


def test_cycles_left_by_a_pause_are_collected_by_a_full_collection():
    with gc_paused():
        a, b = _Node(), _Node()
        a.next, b.next = b, a
        ref = weakref.ref(a)
        del a, b
    assert ref() is not None  # a cycle: reference counting alone does not free it
    gc.collect()
    assert ref() is None


def test_what_others_froze_stays_frozen():
    frozen = _Node()
    gc.freeze()
    try:
        n_frozen = gc.get_freeze_count()
        with gc_paused():
            _Node()
        assert gc.get_freeze_count() == n_frozen
        assert not _in_generation(frozen, 2)
    finally:
        gc.unfreeze()
