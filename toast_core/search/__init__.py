"""Search over the decision space: baselines, MCTS (mctx split), exhaustive enumeration.

`types` (actions, settings, events) <- `env` (legal actions under pins) <- `tree`, `selection`,
`scoring`, `seeding` <- `mcts` (the loop: `search_iter`, `search`); `baselines` builds textbook
strategies from tactics; `exhaustive` enumerates tiny spaces for the optimality gap.
"""

from toast_core.search import baselines
from toast_core.search.mcts import search, search_iter
from toast_core.search.meshes import (
    FitResult,
    MeshPlan,
    MeshProgress,
    mesh_shapes,
    min_devices,
    search_meshes,
    search_meshes_iter,
)
from toast_core.search.types import (
    Remat,
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
    "FitResult",
    "MeshPlan",
    "MeshProgress",
    "Remat",
    "Resolve",
    "SearchEvent",
    "SearchResult",
    "SearchSettings",
    "Shard",
    "Stop",
    "TreeEdge",
    "Verified",
    "baselines",
    "mesh_shapes",
    "min_devices",
    "search",
    "search_iter",
    "search_meshes",
    "search_meshes_iter",
]
