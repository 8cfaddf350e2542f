"""The decision space: strategies, their legality, pins, and the states the search walks.

`Strategy` is the frozen record users keep (conflict options plus named dim -> mesh axes);
`StrategySpace` (via `space_of(ana, mesh)`) owns everything derived from an analysis and a mesh:
units of decision, legality, conversions, notation; `pins` parses and applies pins and forbids.
"""

from toast_core.strategy.axes import MeshAxes, mesh_axes
from toast_core.strategy.pins import (
    Constraints,
    Pin,
    check_pins,
    constrain,
    dim_pin,
    frozen_pins,
    option_pin,
    parse_pin,
    parse_pins,
    remat_pin,
    strategy_pins,
)
from toast_core.strategy.refs import parent_name
from toast_core.strategy.remat import POLICIES, RematGroup, RematSpace, remat_space
from toast_core.strategy.resolve import Resolution, ResolvedDim, resolve
from toast_core.strategy.space import State, StrategySpace, Unit, space_of
from toast_core.strategy.strategy import Strategy

__all__ = [
    "Constraints",
    "MeshAxes",
    "POLICIES",
    "Pin",
    "RematGroup",
    "RematSpace",
    "Resolution",
    "ResolvedDim",
    "State",
    "Strategy",
    "StrategySpace",
    "Unit",
    "check_pins",
    "constrain",
    "dim_pin",
    "frozen_pins",
    "mesh_axes",
    "option_pin",
    "parse_pin",
    "parent_name",
    "parse_pins",
    "remat_pin",
    "remat_space",
    "resolve",
    "space_of",
    "strategy_pins",
]
