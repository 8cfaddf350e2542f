"""Figures of the "fit where nothing fits" views: the memory timeline with and without remat, and
the mesh-shape comparison. Pure functions of engine numbers, like `charts.py`."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.charts import CONFLICT_LINE, _layout, envelope
from app.fmt import binary_unit, fmt_bytes

WITH_REMAT = "#4c78a8"
WITHOUT_REMAT = "#f58518"
FITS, DOES_NOT_FIT = "#54a24b", CONFLICT_LINE


def remat_memory_figure(
    with_remat: tuple[float, ...] | list[float],
    without_remat: tuple[float, ...] | list[float],
    capacity_bytes: float,
    label: str = "with the plan's remat",
) -> go.Figure:
    """Per-device live bytes over program order, with and without the plan's remat (two traces),
    and the device's usable memory as a line (always drawn: whether the curves cross it is the
    question this chart answers)."""
    top = max(max(with_remat, default=0.0), max(without_remat, default=0.0), capacity_bytes)
    scale, unit = binary_unit(top)
    fig = go.Figure()
    for name, timeline, colour, fill in (
        ("without remat", without_remat, WITHOUT_REMAT, None),
        (label, with_remat, WITH_REMAT, "tozeroy"),
    ):
        xs, ys = envelope(timeline)
        peak = max(timeline, default=0.0)
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[b / scale for b in ys],
                mode="lines",
                fill=fill,
                line={"color": colour, "width": 1.5},
                name=f"{name} (peak {fmt_bytes(peak)})",
                hovertemplate=f"op %{{x}}: %{{y:.3f}} {unit}<extra>{name}</extra>",
            )
        )
    fig.add_hline(
        y=capacity_bytes / scale,
        line={"color": CONFLICT_LINE, "dash": "dash"},
        annotation_text=f"usable {fmt_bytes(capacity_bytes)}",
        annotation_position="top left",
    )
    fig.update_yaxes(title=f"{unit} per device", range=[0, top * 1.08 / scale])
    fig.update_xaxes(title="op (program order)")
    return _layout(fig, "Per-device memory over the step, with and without remat")


def mesh_figure(rows: list[dict], capacity_bytes: float) -> go.Figure:
    """Step time and peak memory per mesh shape (`rows`: mesh, step_time_s, peak_bytes, fits),
    green where the plan fits, red where it does not; the usable memory as a line."""
    names = [r["mesh"] for r in rows]
    colours = [FITS if r["fits"] else DOES_NOT_FIT for r in rows]
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("Best step time per mesh shape", "Peak memory per device"),
        horizontal_spacing=0.18,
    )
    fig.add_trace(
        go.Bar(
            y=names,
            x=[r["step_time_s"] for r in rows],
            orientation="h",
            marker_color=colours,
            name="step time",
            hovertemplate="%{y}: %{x:.3s}s<extra></extra>",
            showlegend=False,
        ),
        1,
        1,
    )
    peak = max((r["peak_bytes"] for r in rows), default=0.0)
    scale, unit = binary_unit(max(peak, capacity_bytes))
    fig.add_trace(
        go.Bar(
            y=names,
            x=[r["peak_bytes"] / scale for r in rows],
            orientation="h",
            marker_color=colours,
            name="peak memory",
            text=[fmt_bytes(r["peak_bytes"]) + ("" if r["fits"] else " (no fit)") for r in rows],
            textposition="auto",
            hovertemplate="%{y}: %{text}<extra></extra>",
            showlegend=False,
        ),
        1,
        2,
    )
    fig.add_vline(
        x=capacity_bytes / scale,
        line={"color": CONFLICT_LINE, "dash": "dash"},
        annotation_text=f"usable {fmt_bytes(capacity_bytes)}",
        annotation_font={"size": 10},
        row=1,
        col=2,
    )
    fig.update_xaxes(tickformat="~s", ticksuffix="s", row=1, col=1)
    fig.update_xaxes(title=f"{unit} per device", row=1, col=2)
    fig.update_yaxes(autorange="reversed")
    _layout(fig, "", height=max(260, 90 + 34 * len(rows)))
    fig.update_layout(margin={"l": 10, "r": 10, "t": 30, "b": 10})
    return fig
