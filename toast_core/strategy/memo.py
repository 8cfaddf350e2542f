"""Memoization per analysis, without mutable state on the analysis itself.

An `Analysis` is immutable; what the strategy layer derives from it (the incidence layout, the
resolutions of option sets, the decision space of a mesh) is a pure function of it and of a few
hashable keys. Those results live here, weakly keyed by the analysis (they go when it goes), a
bounded number of keys per analysis, behind a lock (the explorer shares one analysis between
browser sessions, whose searches run in parallel threads).

The builds (the evaluator, the layout, the decision space) allocate a few objects per atom, op
and M-edge; with the collector running, full collections over the analysis's millions of
objects took about half of their time on a 40k-op program, so they run with it paused.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict

from toast_core.gcpause import gc_paused


def per_analysis(max_keys: int = 16):
    """Decorator: memoize `build(ana, *key)` weakly per analysis, at most `max_keys` keys each."""

    def wrap(build):
        table: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        lock = threading.Lock()

        @functools.wraps(build)
        def get(ana, *key):
            with lock:
                per = table.get(ana)
                if per is None:
                    per = table[ana] = OrderedDict()
                hit = per.get(key)
            if hit is not None:
                return hit
            with gc_paused():
                made = build(ana, *key)
            with lock:
                hit = per.setdefault(key, made)
                while len(per) > max_keys:
                    per.popitem(last=False)
            return hit

        return get

    return wrap
