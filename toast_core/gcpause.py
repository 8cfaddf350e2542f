"""Pausing Python's cyclic garbage collector while an analysis or a search runs.

An analysis of a big program allocates millions of small objects and frees none of them early;
every full collection walks them all (about a second at 40k ops), at moments nobody chooses: a
fifth of the analysis time, and broken time budgets in the search. Reference counting still frees
everything, and neither makes many reference cycles, so the collector is paused meanwhile.

When the last pause ends, the young generations (everything allocated during it) are collected
at once, so the deferred work is paid by the phase that made the objects.

The collector is process-wide, so pauses are counted: with analyses and searches running in
several threads (the explorer's sessions), it comes back on when the last one ends, and only if
it was on before the first began.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager

_LOCK = threading.Lock()
_STATE = [0, False]  # pauses running, whether the collector was on when the first began


@contextmanager
def gc_paused():
    with _LOCK:
        if _STATE[0] == 0:
            _STATE[1] = gc.isenabled()
            gc.disable()
        _STATE[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _STATE[0] -= 1
            if _STATE[0] == 0 and _STATE[1]:
                gc.enable()
                # Everything allocated meanwhile is still in the youngest generation: the first
                # allocation after this would collect it all, at whatever moment comes next
                # (inside a later search's time budget). Collect it now, where it was made,
                # once, into the old generation, which is collected rarely.
                gc.collect(1)
