"""Selection policies: plain functions from a node to the child to descend into.

`uct` is UCB1 applied to trees: `Q/N + c * sqrt(ln N_parent / N)`, an unvisited child first.
A variant (PUCT with priors, say) is a new function here, not a subclass.
"""

from __future__ import annotations

import math

from toast_core.search.tree import Node

UCT_C = 0.7


def uct(node: Node, c: float = UCT_C) -> Node:
    log_n = math.log(max(node.visits, 1))
    best, best_u = None, -1.0
    for child in node.ordered_children():
        if child.visits == 0:
            return child
        u = child.value / child.visits + c * math.sqrt(log_n / child.visits)
        if u > best_u:
            best, best_u = child, u
    return best
