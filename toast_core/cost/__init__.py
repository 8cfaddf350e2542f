"""The cost model: pure functions over a `MeshSpec` and a `HardwareSpec` (DESIGN.md §4)."""

from __future__ import annotations

from toast_core.cost.model import (
    Collective,
    CostOptions,
    CostReport,
    Evaluator,
    Score,
    estimate,
    evaluator,
)
from toast_core.cost.opview import OpView, costliest_ops, op_view
from toast_core.cost.remat_compare import (
    RematComparison,
    RematGroupCost,
    remat_comparison,
    remat_groups,
)
from toast_core.cost.whatif import Explanation, WhatIf, explain

__all__ = [
    "Collective",
    "CostOptions",
    "CostReport",
    "Evaluator",
    "Explanation",
    "OpView",
    "RematComparison",
    "RematGroupCost",
    "Score",
    "costliest_ops",
    "WhatIf",
    "estimate",
    "evaluator",
    "explain",
    "op_view",
    "remat_comparison",
    "remat_groups",
]
