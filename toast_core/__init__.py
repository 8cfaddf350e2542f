"""TOAST: Named Dimension Analysis + Monte Carlo Tree Search auto-sharding for JAX."""

from toast_core.analysis import Analysis, Conflict, NamedDim, analyze
from toast_core.errors import ToastError
from toast_core.ir import Program, trace

__all__ = ["Analysis", "Conflict", "NamedDim", "Program", "ToastError", "analyze", "trace"]
