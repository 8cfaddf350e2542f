"""Strategies: chosen conflict options plus named dim -> mesh axes, and their resolution."""

from toast_core.strategy.resolve import Resolution, ResolvedDim, resolve
from toast_core.strategy.strategy import Strategy

__all__ = ["Resolution", "ResolvedDim", "Strategy", "resolve"]
