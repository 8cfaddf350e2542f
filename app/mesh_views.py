"""The Search page's mesh-shape comparison: `tc.search_meshes_iter` over the factorizations of
the current device count within a budget the user sets, streamed into a chart of step time and
peak memory per shape; one click switches to a shape (`apply_mesh`, shared with "make it fit")."""

from __future__ import annotations

import time

import streamlit as st

import toast_core as tc
from app import cached, fit_charts, fit_options, state
from app.cached import Loaded
from app.fmt import fmt_bytes, fmt_s

DRAW_EVERY_S = 0.35


def apply_mesh(mesh_text: str, strategy: tc.Strategy | None, plan=None) -> None:
    """Switches to `mesh_text`, starts its run slot with the plan found there (if it has no
    results yet), and searches again when the pins hold on the new mesh."""
    old = state.mesh_text()
    if not state.commit_mesh(mesh_text):
        return
    state.set_setting("mesh_input", state.mesh_text())
    slot = state.run_slot()
    if slot["best"] is None and strategy is not None and plan is not None:
        slot.update(
            status="done",
            best=strategy,
            best_step_time_s=plan.step_time_s,
            best_peak_bytes=plan.peak_bytes,
            best_fits=plan.fits,
            # Found under these: a search under the same pins keeps it if it finds no better.
            pins=list(fit_options.shape_free_pins(tuple(state.workspace()["pins"]))),
        )
    pins = tuple(state.workspace()["pins"])
    try:
        cached.check_pins(state.loaded(), state.mesh_text(), state.hardware_name(), pins)
    except tc.ToastError as exc:
        state.notify(
            "fit",
            f"Mesh `{state.mesh_text()}` (was `{old}`); not searched again: {exc}. Remove the "
            "pins that name other mesh axes, then run.",
        )
        return
    state.notify(
        "fit", f"Mesh `{state.mesh_text()}` (was `{old}`: its results are kept). Searching again."
    )
    st.session_state["search_requested"] = True


def _request_meshes() -> None:
    st.session_state["meshes_requested"] = True


def mesh_comparison(loaded: Loaded) -> None:
    """search_meshes over the factorizations of the current device count, within a budget the
    user sets, streaming; a chart of step time and peak per mesh shape; one click uses a shape."""
    n = state.mesh().n_devices
    st.subheader(f"Mesh shapes of {n} device{'' if n == 1 else 's'}")
    if n < 4:
        st.caption(f"{n} device{'s' if n > 1 else ''}: one mesh shape only, nothing to compare.")
        return
    st.caption(
        f"Every factorization of {n} into 1-3 mesh axes (`tc.search_meshes`), each searched "
        "within an equal share of the budget. Pins on named dims name mesh axes that some "
        "shapes lack, so only remat and conflict pins apply here."
    )
    st.session_state.setdefault("mesh_budget_s", 6.0)
    c1, c2 = st.columns([2, 6], vertical_alignment="bottom")
    c1.number_input(
        "Budget (s)", min_value=0.5, max_value=600.0, step=1.0, **state.bound("mesh_budget_s")
    )
    c2.button("Compare mesh shapes", key="mesh_compare", on_click=_request_meshes)
    pins = fit_options.shape_free_pins(tuple(state.workspace()["pins"]))
    key = (loaded.key, n, state.hardware_name(), pins)
    store = st.session_state.setdefault("mesh_rankings", {})
    live = st.empty()
    if st.session_state.get("meshes_requested", False):  # cleared once done (see fit_views)
        try:
            store[key] = _stream_meshes(loaded, n, pins, live)
        except tc.ToastError as exc:
            st.session_state.pop("meshes_requested", None)
            live.error(str(exc))
            return
        st.session_state.pop("meshes_requested", None)
    ranking = store.get(key)
    if not ranking:
        return
    live.empty()  # the streamed draws' progress bar and tables go (a container would keep them)
    with live.container():
        _draw_ranking(ranking, _usable_bytes(), "final")
    labels = [str(p.mesh) for p in ranking]
    c3, c4 = st.columns([4, 2], vertical_alignment="bottom")
    if st.session_state.get("mesh_pick") not in labels:
        st.session_state["mesh_pick"] = labels[0]
    c3.selectbox("Mesh shape", labels, key="mesh_pick")
    plan = ranking[labels.index(st.session_state.mesh_pick)]
    c4.button(
        "Use this mesh",
        key="mesh_use",
        on_click=apply_mesh,
        args=(str(plan.mesh), plan.strategy, plan),
        disabled=str(plan.mesh) == state.mesh_text(),
        width="stretch",
    )


def _stream_meshes(loaded: Loaded, n: int, pins: tuple, live) -> tuple:
    capacity = _usable_bytes()
    events = tc.search_meshes_iter(
        loaded.ana,
        n,
        state.hardware(),
        budget_s=float(st.session_state.mesh_budget_s),
        seed=int(st.session_state.get("seed", 0)),
        pins=pins,
        num_simulations=int(st.session_state.get("num_simulations", 0)) or None,
    )
    last_draw, shown, ranking = 0.0, -1, ()
    for i, p in enumerate(events):
        ranking = p.ranking
        if p.done:
            break
        if len(ranking) != shown or time.perf_counter() - last_draw >= DRAW_EVERY_S:
            shown, last_draw = len(ranking), time.perf_counter()
            with live.container():
                st.progress(
                    p.shape_index / max(p.n_shapes, 1),
                    text=f"Searching mesh {p.mesh} ({p.shape_index + 1}/{p.n_shapes})",
                )
                if ranking:  # the chart only: a streamed table outlived the run in Chromium
                    _draw_ranking(ranking, capacity, str(i), table=False)
    return ranking


def _usable_bytes() -> float:
    """The device memory a plan may use (the cost model's default headroom kept free)."""
    return state.hardware().hbm_capacity_bytes * (1.0 - tc.CostOptions().memory_headroom)


def _draw_ranking(ranking, capacity_bytes: float, tag: str, table: bool = True) -> None:
    rows = [
        {
            "mesh": str(p.mesh),
            "step_time_s": p.step_time_s,
            "peak_bytes": p.peak_bytes,
            "fits": p.fits,
        }
        for p in ranking
    ]
    st.plotly_chart(
        fit_charts.mesh_figure(rows, capacity_bytes), width="stretch", key=f"mesh_chart_{tag}"
    )
    if not table:
        return
    st.dataframe(
        [
            {
                "mesh": str(p.mesh),
                "step time": fmt_s(p.step_time_s),
                "peak memory": fmt_bytes(p.peak_bytes),
                "fits": "yes" if p.fits else "NO",
                "efficiency": f"{p.efficiency:.1%}",
                "remat": ", ".join(f"{g}={pol}" for g, pol in p.strategy.remat) or "-",
            }
            for p in ranking
        ],
        hide_index=True,
        width="stretch",
        key=f"mesh_table_{tag}",
    )
