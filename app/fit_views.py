"""Fit where nothing fits, on the Search page: the "make it fit" panel, and (from `mesh_views`)
the mesh-shape comparison; the Strategy page's memory with and without remat is `remat_views`.

The pricing lives in `fit_options.py` and the engine (`tc.min_devices`, `tc.search_iter`).
Applying an option never loses state: pins change in the model's workspace, a new mesh or batch
gets its own run slot (the old configuration's results stay, one switch away on the Model page),
and the search then runs again on the new configuration.
"""

from __future__ import annotations

import dataclasses

import streamlit as st

import toast_core as tc
from app import fit_options, state, ui
from app.cached import Loaded
from app.fit_options import FitOption
from app.fmt import fmt_bytes, fmt_s
from app.mesh_views import apply_mesh, mesh_comparison

__all__ = ["make_it_fit", "mesh_comparison", "show_notice"]


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
        "No plan fits the device's memory. Three ways out, each priced: recompute activations in "
        "the backward (the search above, with remat pinned), spread the plan over more devices "
        "(each power-of-two count searched within the budget below), or train on a smaller batch "
        "(the search's seeding at each halved batch). Applying one keeps everything found so far."
    )
    st.session_state.setdefault("fit_budget_s", 8.0)
    c1, c2 = st.columns([2, 6], vertical_alignment="bottom")
    c1.number_input(
        "Budget per device count (s)",
        min_value=0.5,
        max_value=300.0,
        step=1.0,
        help="Each device count tried by `tc.min_devices` shares this among its mesh shapes.",
        **state.bound("fit_budget_s"),
    )
    c2.button("Find ways to fit", key="fit_find", on_click=_request_fit)
    store = st.session_state.setdefault("fit_options", {})
    key = _fit_key()
    # The request is cleared only once priced: a rerun that interrupts the pricing (another
    # widget, a polling fragment) resumes it instead of dropping the click.
    if st.session_state.get("fit_requested", False):
        store[key] = _price_options(loaded, float(st.session_state.fit_budget_s), slot["best"])
        st.session_state.pop("fit_requested", None)
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
    # The search the Run button would run (same budget, simulations and seed), so that applying
    # the option finds the plan it was priced with.
    search_budget_s = float(st.session_state.get("budget_s", 5.0))
    remat = fit_options.remat_option(
        loaded, mesh_text, hw_name, pins, search_budget_s, sims, seed, current=best
    )

    def progress(p: tc.MeshProgress) -> None:
        if p.mesh is not None:
            bar.progress(
                1 / 3 + (p.shape_index / max(p.n_shapes, 1)) / 3,
                text=f"More devices: {p.mesh.n_devices} devices, mesh {p.mesh} "
                f"({p.shape_index + 1}/{p.n_shapes})",
            )

    bar.progress(1 / 3, text="More devices: the smallest power-of-two count that fits...")
    n_devices = state.mesh().n_devices
    mesh = fit_options.mesh_option(
        loaded, n_devices, hw_name, budget_s, progress, seed, pins, num_simulations=sims
    )
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
        apply_mesh(option.mesh_text, option.strategy, option)
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


def show_notice() -> None:
    """The message of the last applied option (shown once, at the top of the Search page)."""
    notice = state.pop_notice("fit")
    if notice:
        st.info(notice)
