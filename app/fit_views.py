"""Fit where nothing fits, in the explorer: the Strategy page's memory with and without remat, the
Search page's "make it fit" panel and its mesh-shape comparison.

The pages call one function each (`memory_section`, `make_it_fit`, `mesh_comparison`); the
pricing lives in `fit_options.py` and the engine (`tc.remat_comparison`, `tc.min_devices`,
`tc.search_meshes_iter`). Applying an option never loses state: pins change in the model's
workspace, a new mesh or batch gets its own run slot (the old configuration's results stay, one
switch away on the Model page), and the search then runs again on the new configuration.
"""

from __future__ import annotations

import dataclasses
import time

import streamlit as st

import toast_core as tc
from app import cached, charts, fit_charts, fit_options, state, ui
from app.cached import Loaded
from app.fit_options import FitOption
from app.fmt import fmt_bytes, fmt_s

DRAW_EVERY_S = 0.35

# -- Strategy page: memory with and without remat -----------------------------------------------


@st.cache_resource(show_spinner=False, max_entries=32)
def _comparison(key: str, mesh_text: str, hw_name: str, skey: tuple, _ana, _strategy):
    return tc.remat_comparison(_ana, _strategy, cached.mesh_of(mesh_text), tc.hardware(hw_name))


def memory_section(loaded: Loaded, strategy: tc.Strategy, report: tc.CostReport) -> None:
    """Per-device memory over the step; with the plan's remat beside the same plan without it,
    and which layers recompute at what cost."""
    st.subheader("Per-device memory")
    mesh_text, hw_name = state.mesh_text(), state.hardware_name()
    prog = loaded.ana.program
    peak_label = prog.ops[report.peak_op].where() if 0 <= report.peak_op < len(prog.ops) else ""
    if not strategy.remat:
        st.plotly_chart(
            charts.memory_figure(
                report.memory_timeline,
                report.capacity_bytes,
                report.persistent_bytes,
                report.peak_op,
                peak_label,
            ),
            width="stretch",
        )
        st.caption(
            f"Inputs (parameters, optimizer state, data) take {fmt_bytes(report.persistent_bytes)} "
            f"per device; the peak {fmt_bytes(report.peak_bytes)} is reached at "
            f"{peak_label or 'the end'}." + _full_remat_hint(loaded, strategy, report)
        )
        return
    cmp = _comparison(
        loaded.key, mesh_text, hw_name, cached.strategy_key(strategy), loaded.ana, strategy
    )
    plain = cmp.without_remat
    st.plotly_chart(
        fit_charts.remat_memory_figure(
            report.memory_timeline, plain.memory_timeline, report.capacity_bytes
        ),
        width="stretch",
        key="remat_memory",
    )
    m = st.columns(4)
    m[0].metric(
        "Recompute flops",
        f"{cmp.recompute_flops_fraction:.1%}",
        help="Forward flops run again in the backward, over the plan's flops per device.",
    )
    m[1].metric("Step time vs no remat", f"{_signed_s(cmp.step_time_delta_s)}")
    m[2].metric(
        "Peak vs no remat",
        _signed_bytes(cmp.peak_delta_bytes),
        "fits only with remat" if report.fits and not plain.fits else None,
        delta_color="off",
    )
    m[3].metric("Peak without remat", fmt_bytes(plain.peak_bytes), "fits" if plain.fits else "NO")
    ui.table(_group_rows(cmp), key="remat_groups")
    st.caption(
        f"The peak {fmt_bytes(report.peak_bytes)} is reached at {peak_label or 'the end'}. "
        "Each row prices its group against the same plan with that group alone keeping "
        "everything; recomputed residuals live only while their layer's backward runs."
    )


def _group_rows(cmp: tc.RematComparison) -> list[dict]:
    rows = []
    for g in cmp.groups:
        layers = g.layers[0] if len(g.layers) == 1 else f"{g.layers[0]} … {g.layers[-1]}"
        rows.append(
            {
                "remat group": g.group,
                "layers": f"{len(g.layers)}: {layers}",
                "policy": g.policy,
                "ops recomputed": g.recompute_ops,
                "recompute flops / device": f"{g.recompute_flops_per_device:.3g}",
                "residuals dropped / device": fmt_bytes(g.dropped_bytes_per_device),
                "Δ step time": _signed_s(g.step_time_delta_s) if g.policy != "none" else "",
                "Δ peak": _signed_bytes(g.peak_delta_bytes) if g.policy != "none" else "",
            }
        )
    return rows


def _full_remat_hint(loaded: Loaded, strategy: tc.Strategy, report: tc.CostReport) -> str:
    """What full remat everywhere would do to this plan (one line), when the program has any."""
    if not tc.remat_groups(loaded.ana):
        return ""
    full = strategy.with_remat(loaded.ana, "full")
    r = cached.estimate(loaded, full, state.mesh_text(), state.hardware_name())
    return (
        f" No remat in this plan; with every layer group recomputed (`remat[...]=full`) the peak "
        f"would be {fmt_bytes(r.peak_bytes)} ({_signed_bytes(r.peak_bytes - report.peak_bytes)}) "
        f"and the step {fmt_s(r.step_time_s)} ({_signed_s(r.step_time_s - report.step_time_s)})."
    )


def _signed_s(x: float) -> str:
    return ("+" if x >= 0 else "-") + fmt_s(abs(x))


def _signed_bytes(x: float) -> str:
    return ("+" if x >= 0 else "-") + fmt_bytes(abs(x))


# -- Search page: make it fit -------------------------------------------------------------------


def _fit_key() -> tuple:
    return (*state.run_key(), tuple(state.workspace()["pins"]))


def _request_fit() -> None:
    st.session_state["fit_requested"] = True


def make_it_fit(loaded: Loaded, slot: dict) -> None:
    """When the last search found no plan that fits: remat, more devices, a smaller batch, each
    priced, one click to apply (then the search runs again)."""
    if slot["best_fits"] is not False or slot["status"] not in ("done", "stopped"):
        return
    st.subheader("Make it fit")
    st.caption(
        "No plan fits the device's memory. Three ways out, each priced by a short search: "
        "recompute activations in the backward, spread the plan over more devices, or train on a "
        "smaller batch. Applying one keeps everything found so far."
    )
    st.session_state.setdefault("fit_budget_s", 4.0)
    c1, c2 = st.columns([2, 6], vertical_alignment="bottom")
    c1.number_input(
        "Budget per option (s)",
        min_value=0.5,
        max_value=300.0,
        step=1.0,
        **state.bound("fit_budget_s"),
    )
    c2.button("Find ways to fit", key="fit_find", on_click=_request_fit)
    store = st.session_state.setdefault("fit_options", {})
    key = _fit_key()
    if st.session_state.pop("fit_requested", False):
        store[key] = _price_options(loaded, float(st.session_state.fit_budget_s), slot["best"])
    options = store.get(key)
    if options is None:
        return
    ui.table([_option_row(o) for o in options], key="fit_table")
    cols = st.columns(len(options))
    for col, o in zip(cols, options):
        col.button(
            f"Apply: {o.title}",
            key=f"fit_apply_{o.kind}",
            on_click=_apply,
            args=(o,),
            disabled=not o.available,
            width="stretch",
        )
    for o in options:
        if o.kind == "mesh" and o.arithmetic:
            st.caption("Why fewer devices cannot fit: " + "; ".join(o.arithmetic))


def _price_options(loaded: Loaded, budget_s: float, best: tc.Strategy) -> list[FitOption]:
    mesh_text, hw_name = state.mesh_text(), state.hardware_name()
    pins = tuple(state.workspace()["pins"])
    sims = int(st.session_state.get("num_simulations", 0)) or None
    seed = int(st.session_state.get("seed", 0))
    bar = st.progress(0.0, text="Remat: searching with every layer group recomputed...")
    remat = fit_options.remat_option(
        loaded, mesh_text, hw_name, pins, budget_s, sims, seed, current=best
    )

    def progress(p: tc.MeshProgress) -> None:
        if p.mesh is not None:
            bar.progress(
                1 / 3 + (p.shape_index / max(p.n_shapes, 1)) / 3,
                text=f"More devices: {p.mesh.n_devices} devices, mesh {p.mesh} "
                f"({p.shape_index + 1}/{p.n_shapes})",
            )

    bar.progress(1 / 3, text="More devices: the smallest power-of-two count that fits...")
    mesh = fit_options.mesh_option(loaded, hw_name, budget_s, progress, seed)
    bar.progress(2 / 3, text="A smaller batch: halving it until a plan fits...")
    batch = fit_options.batch_option(
        loaded,
        mesh_text,
        hw_name,
        pins,
        lambda b: bar.progress(2 / 3, text=f"A smaller batch: tracing and pricing batch {b}..."),
    )
    bar.empty()
    return [remat, mesh, batch]


def _option_row(o: FitOption) -> dict:
    if not o.available:
        return {"option": o.title, "change": o.note, "step time": "", "peak memory": "", "fits": ""}
    return {
        "option": o.title,
        "change": o.change,
        "step time": fmt_s(o.step_time_s),
        "peak memory": fmt_bytes(o.peak_bytes),
        "fits": "yes" if o.fits else "NO",
    }


def _apply(option: FitOption) -> None:
    """on_click: apply one option, then ask the Search page to search again."""
    if option.kind == "remat":
        pins = state.workspace()["pins"]
        pins[:] = list(option.pins)
        state.notify("fit", f"Applied: {option.change}. Searching again under these pins.")
    elif option.kind == "mesh":
        _apply_mesh(option.mesh_text, option.strategy, option)
        return
    else:
        old_pins = list(state.workspace()["pins"])
        new_spec = dataclasses.replace(state.spec(), batch=option.batch)
        if state.commit_model(new_spec) is None:
            return
        ws = state.workspace()
        if not ws["pins"]:
            ws["pins"][:] = list(option.pins)
        kept = "kept" if list(option.pins) == old_pins else "left out (they do not hold)"
        state.notify(
            "fit",
            f"Loaded {new_spec.title}; your pins were {kept}. The model at its own batch stays "
            "on the Model page with its results.",
        )
    st.session_state["search_requested"] = True


def _apply_mesh(mesh_text: str, strategy: tc.Strategy | None, plan=None) -> None:
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


def show_notice() -> None:
    """The message of the last applied option (shown once, at the top of the Search page)."""
    notice = state.pop_notice("fit")
    if notice:
        st.info(notice)


# -- Search page: mesh shapes -------------------------------------------------------------------


def _request_meshes() -> None:
    st.session_state["meshes_requested"] = True


def mesh_comparison(loaded: Loaded) -> None:
    """search_meshes over the factorizations of the current device count, within a budget the
    user sets, streaming; a chart of step time and peak per mesh shape; one click uses a shape."""
    n = state.mesh().n_devices
    st.subheader(f"Mesh shapes of {n} devices")
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
    pins = tuple(p for p in state.workspace()["pins"] if tc.parse_pin(p).kind != "dim")
    key = (loaded.key, n, state.hardware_name(), pins)
    store = st.session_state.setdefault("mesh_rankings", {})
    live = st.empty()
    if st.session_state.pop("meshes_requested", False):
        try:
            store[key] = _stream_meshes(loaded, n, pins, live)
        except tc.ToastError as exc:
            live.error(str(exc))
            return
    ranking = store.get(key)
    if not ranking:
        return
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
        on_click=_apply_mesh,
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
                if ranking:
                    _draw_ranking(ranking, capacity, str(i))
    return ranking


def _usable_bytes() -> float:
    """The device memory a plan may use (the cost model's default headroom kept free)."""
    return state.hardware().hbm_capacity_bytes * (1.0 - tc.CostOptions().memory_headroom)


def _draw_ranking(ranking, capacity_bytes: float, tag: str) -> None:
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
