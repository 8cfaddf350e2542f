"""Human formatting of bytes, seconds and mesh axes for tables and captions."""

from __future__ import annotations

import math

from toast_core.fmt import fmt_bytes, fmt_s

__all__ = ["binary_unit", "fmt_axes", "fmt_bytes", "fmt_ratio", "fmt_s"]


def binary_unit(max_bytes: float) -> tuple[float, str]:
    """(divisor, unit) to plot byte values up to `max_bytes` in binary units, as `fmt_bytes`
    writes them (plotly's SI ticks would print decimal MB next to our MiB)."""
    scale, unit = 1.0, "B"
    for next_unit in ("KiB", "MiB", "GiB", "TiB"):
        if max_bytes < 1024 * scale:
            break
        scale, unit = scale * 1024, next_unit
    return scale, unit


def fmt_axes(axes: tuple[str, ...] | list[str]) -> str:
    """Mesh axes as written in pins: `data+model`, or `-` for replicated."""
    return "+".join(axes) if axes else "-"


def fmt_ratio(x: float | None) -> str:
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return "-"
    return f"{x:.2f}x"
