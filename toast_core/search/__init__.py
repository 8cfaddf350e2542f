"""Search over the decision space: baselines, MCTS (mctx split), exhaustive enumeration.

`types` (actions, settings, events) <- `env` (legal actions under pins) <- `tree`, `selection`,
`scoring`, `seeding` <- `mcts` (the loop: `search_iter`, `search`); `baselines` builds textbook
strategies from tactics; `exhaustive` enumerates tiny spaces for the optimality gap.
"""

from toast_core.search import baselines
from toast_core.search.mcts import search, search_iter
from toast_core.search.types import (
    Resolve,
    SearchEvent,
    SearchResult,
    SearchSettings,
    Shard,
    Stop,
    TreeEdge,
    Verified,
)

__all__ = [
    "Resolve",
    "SearchEvent",
    "SearchResult",
    "SearchSettings",
    "Shard",
    "Stop",
    "TreeEdge",
    "Verified",
    "baselines",
    "search",
    "search_iter",
]
