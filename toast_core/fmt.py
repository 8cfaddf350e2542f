"""Human formatting of bytes and seconds, one way for the CLI, the explorer and messages."""

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


def fmt_s(t: float | None) -> str:
    """`0.00123` -> `1.230 ms`."""
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
