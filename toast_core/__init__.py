"""TOAST: Named Dimension Analysis + Monte Carlo Tree Search auto-sharding for JAX.

import toast_core as tc
prog = tc.trace(fn, *example_args)
ana = tc.analyze(prog)
mesh, hw = tc.MeshSpec({"data": 2, "model": 4}), tc.hardware("tpu-v5e")
result = tc.search(ana, mesh, hw, budget_s=10)
sharded_fn = tc.shard(fn, ana, result.best, tc.jax_mesh(mesh))
ranking = tc.search_meshes(ana, devices=256, hw=hw, budget_s=60)   # best plan per mesh shape
fit = tc.min_devices(ana, hw)                                      # smallest count that fits
"""

from toast_core.analysis import Analysis, Conflict, ConflictOption, NamedDim, analyze
from toast_core.apply import (
    ValidationReport,
    jax_mesh,
    partition_specs,
    plan_module,
    shard,
    validate,
)
from toast_core.cost import (
    CostOptions,
    CostReport,
    Explanation,
    OpView,
    RematComparison,
    RematGroupCost,
    WhatIf,
    costliest_ops,
    estimate,
    explain,
    op_view,
    remat_comparison,
    remat_groups,
)
from toast_core.errors import PinError, StrategyError, ToastError, TraceError
from toast_core.gcpause import gc_paused
from toast_core.ir import Program, trace
from toast_core.mesh import HARDWARE_PRESETS, HardwareSpec, MeshSpec, hardware
from toast_core.search import (
    FitResult,
    MeshPlan,
    MeshProgress,
    SearchEvent,
    SearchResult,
    SearchSettings,
    baselines,
    mesh_shapes,
    min_devices,
    search,
    search_iter,
    search_meshes,
    search_meshes_iter,
)
from toast_core.strategy import (
    Pin,
    Strategy,
    check_pins,
    dim_pin,
    frozen_pins,
    option_pin,
    parent_name,
    parse_pin,
    remat_pin,
    strategy_pins,
)

__all__ = [
    "HARDWARE_PRESETS",
    "Analysis",
    "Conflict",
    "ConflictOption",
    "CostOptions",
    "CostReport",
    "Explanation",
    "FitResult",
    "HardwareSpec",
    "MeshPlan",
    "MeshProgress",
    "MeshSpec",
    "NamedDim",
    "OpView",
    "Pin",
    "PinError",
    "Program",
    "RematComparison",
    "RematGroupCost",
    "SearchEvent",
    "SearchResult",
    "SearchSettings",
    "Strategy",
    "StrategyError",
    "ToastError",
    "TraceError",
    "ValidationReport",
    "WhatIf",
    "analyze",
    "baselines",
    "check_pins",
    "costliest_ops",
    "dim_pin",
    "frozen_pins",
    "gc_paused",
    "estimate",
    "explain",
    "hardware",
    "jax_mesh",
    "mesh_shapes",
    "min_devices",
    "op_view",
    "option_pin",
    "parent_name",
    "parse_pin",
    "partition_specs",
    "plan_module",
    "remat_comparison",
    "remat_groups",
    "remat_pin",
    "search",
    "search_iter",
    "search_meshes",
    "search_meshes_iter",
    "shard",
    "strategy_pins",
    "trace",
    "validate",
]
