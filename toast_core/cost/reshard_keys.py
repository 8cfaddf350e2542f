"""The scalar reshard rules shared by the two Python pricings of a few reshard sites: the
evaluator's candidate sites (`Evaluator._scalar_reshards`) and a restricted view's
(`view_comm.ScalarView`). Both must give `Evaluator._numpy_reshards`' arrays bit for bit
(tests/test_view_comm.py); keeping the site rules and the grouping in one place keeps the two
from drifting apart.

Masks are ints, one bit per mesh axis; `real` has the bits of axes larger than 1 and `n_bits`
counts a mask's bits."""

from __future__ import annotations


def classify(vms, ums, real: int, n_bits) -> tuple[int, int, list | None] | None:
    """(gathered axes, moved axes, gathered axes per dim) of a site whose value holds mesh axes
    `vms` per dim and whose use wants `ums`: an axis the value holds and the use does not is
    gathered, one both hold on different dims is moved (an all-to-all); the per-dim list only
    when something moves. None for an odd site, which takes XLA's permuting reshard
    (`Evaluator._exact_reshard`): a dim gaining and losing axes at once, or changing a dim
    sharded over several axes."""
    hv = hu = same = 0
    for vm, um in zip(vms, ums):
        hv |= vm
        hu |= um
        same |= vm & um
        if (vm & ~um & real) and (um & ~vm & real):
            return None
        if (vm ^ um) & real and (n_bits[vm & real] > 1 or n_bits[um & real] > 1):
            return None
    gather, moved = hv & ~hu & real, hv & hu & ~same & real
    if not (gather | moved):
        return 0, 0, None
    return gather, moved, [vm & ~um & real & ~hu for vm, um in zip(vms, ums)]


def group_by_key(active, fields, n_ops: int) -> dict[int, list]:
    """The distinct reshards of `active` ((key, site, gathered, moved) in site order), each as
    [first site, first reader, last reader or holder, last forward reader, first backward
    reader, gathered, moved]; `fields(site)` is the site's (op, op holding it, backward?)."""
    groups: dict[int, list] = {}
    for key, s, gathered, moved in active:
        op, hold, backward = fields(s)
        g = groups.get(key)
        if g is None:
            g = groups[key] = [s, op, op, -1, n_ops, gathered, moved]
        else:
            g[1] = min(g[1], op)
            g[2] = max(g[2], op)
        g[2] = max(g[2], hold)
        if backward:
            g[4] = min(g[4], op)
        else:
            g[3] = max(g[3], op)
    return groups
