"""Human formatting of bytes, seconds and mesh axes for tables and captions."""

from __future__ import annotations

import math

from toast_core.fmt import fmt_bytes, fmt_s

__all__ = ["fmt_axes", "fmt_bytes", "fmt_ratio", "fmt_s"]


def fmt_axes(axes: tuple[str, ...] | list[str]) -> str:
    """Mesh axes as written in pins: `data+model`, or `-` for replicated."""
    return "+".join(axes) if axes else "-"


def fmt_ratio(x: float | None) -> str:
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return "-"
    return f"{x:.2f}x"
