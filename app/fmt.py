"""Human formatting of bytes, seconds and mesh axes for tables and captions."""

from __future__ import annotations

import math


def fmt_bytes(n: float | None) -> str:
    """`1536` -> `1.5 KiB`; binary units, as memory capacities are quoted."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{int(n)} B" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    return f"{sign}{n:.1f} TiB"


def binary_unit(max_bytes: float) -> tuple[float, str]:
    """(divisor, unit) to plot byte values up to `max_bytes` in binary units, as `fmt_bytes`
    writes them (plotly's SI ticks would print decimal MB next to our MiB)."""
    scale, unit = 1.0, "B"
    for next_unit in ("KiB", "MiB", "GiB", "TiB"):
        if max_bytes < 1024 * scale:
            break
        scale, unit = scale * 1024, next_unit
    return scale, unit


def fmt_s(t: float | None) -> str:
    """`0.00123` -> `1.23 ms`."""
    if t is None or (isinstance(t, float) and math.isnan(t)):
        return "-"
    a = abs(t)
    if a >= 1:
        return f"{t:.3f} s"
    if a >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    if a == 0:
        return "0 s"
    return f"{t * 1e6:.2f} us"


def fmt_axes(axes: tuple[str, ...] | list[str]) -> str:
    """Mesh axes as written in pins: `data+model`, or `-` for replicated."""
    return "+".join(axes) if axes else "-"


def fmt_ratio(x: float | None) -> str:
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return "-"
    return f"{x:.2f}x"
