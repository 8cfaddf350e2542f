"""Human formatting of bytes, seconds and mesh axes for tables and captions."""

from __future__ import annotations

import math

from toast_core.fmt import fmt_bytes, fmt_s

__all__ = ["binary_unit", "fmt_axes", "fmt_bytes", "fmt_ratio", "fmt_s", "fmt_s_short"]


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


def fmt_s_short(t: float | None) -> str:
    """Seconds to three significant digits (`0.3692` -> `369 ms`, `0.0931` -> `93.1 ms`): for
    `st.metric` values, which a 1280 px window cuts at about seven characters in a row of five
    or six ("369.2…"); `fmt_s` keeps three decimals for tables."""
    if t is None or (isinstance(t, float) and (math.isnan(t) or math.isinf(t))):
        return "-"
    t = float(f"{t:.3g}")  # 0.9999 -> 1.00 s, not 1000 ms
    a = abs(t)
    if a == 0:
        return "0 s"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if a >= scale or unit == "us":
            x = t / scale
            digits = 0 if abs(x) >= 99.95 else (1 if abs(x) >= 9.995 else 2)
            return f"{x:.{digits}f} {unit}"
    return fmt_s(t)
