"""The one exception root of toast_core.

Exceptions are only for bad input (a wrong argument, an illegal strategy, a function that cannot be
traced). Conflicts and diagnostics are *values* returned by the analysis, never exceptions. Every
message names the argument and shows the offending value, as in "expected X, got `name=value`".
"""

from __future__ import annotations


class ToastError(ValueError):
    """Base class of every error raised by toast_core for bad input."""


class TraceError(ToastError):
    """The function or its example arguments could not be traced."""


class StrategyError(ToastError):
    """A strategy is illegal for its analysis or mesh."""


class PinError(ToastError):
    """A pin or forbid cannot be parsed, names nothing, or contradicts another pin."""


def bad_value(argument: str, value: object, expected: str) -> str:
    """Formats the standard one-line message: what was expected, which argument, which value."""
    shown = repr(value)
    if len(shown) > 200:
        shown = shown[:197] + "..."
    return f"expected {expected}, got `{argument}={shown}`"


def bad_values(argument: str, values, expected: str, limit: int = 5) -> str:
    """One line for many bad values of one argument (a strategy file from another model names
    dozens of missing named dims): the first `limit` shown, the rest counted."""
    values = list(values)
    if len(values) == 1:
        return bad_value(argument, values[0], expected)
    shown = ", ".join(repr(v) for v in values[:limit])
    more = f" (+{len(values) - limit} more)" if len(values) > limit else ""
    return f"expected {expected}, got {len(values)} other `{argument}` entries: {shown}{more}"
