"""Search page: budget, seed, pins and forbids; Run / Stop; the live best cost and strategy."""

from __future__ import annotations

import time
from itertools import combinations

import streamlit as st

import toast_core as tc
from app import cached, charts, fit_views, remat_views, reports, state, ui
from app.dim_names import DimNamer, public_text
from app.fmt import fmt_bytes, fmt_s, fmt_s_short

DRAW_EVERY_S = 0.35

ui.header(
    "Search",
    "Monte Carlo Tree Search over the named dims' mesh axes and the conflicts' options, scored by "
    "the cost model. Pin or forbid decisions, run, then pin what you like and search again.",
)
loaded = ui.require_loaded()
ana = loaded.ana
mesh = state.mesh()
st.markdown(ui.context_line(loaded))
ws = state.workspace()
slot = state.run_slot()
# A run still marked running was interrupted (Stop, or a page switch): keep the better best.
state.settle_interrupted(slot)
fit_views.show_notice()  # what a "make it fit" option or a mesh shape just changed


# -- pins ---------------------------------------------------------------------------------------


def _add_pin(text: str) -> None:
    text = (text or "").strip().replace(" ", "")
    current = state.workspace()["pins"]
    if not text:
        state.set_error("pins", "expected a pin such as N3@model, got an empty text")
        return
    if text in current:
        state.set_error("pins", None)
        state.notify("pins", f"`{text}` is already pinned.")
        return
    loaded_ = state.loaded()
    try:
        cached.check_pins(
            loaded_, state.mesh_text(), state.hardware_name(), tuple(current + [text])
        )
    except tc.ToastError as exc:
        state.set_error("pins", str(exc))
        return
    current.append(text)
    state.set_error("pins", None)


def _add_dim_pin() -> None:
    ss = st.session_state
    axes = ss.pin_axes
    _add_pin(tc.dim_pin(ss.pin_dim, axes, forbid=ss.pin_mode == "forbid"))


def _add_conflict_pin() -> None:
    ss = st.session_state
    option = None if ss.pin_option == "none" else int(ss.pin_option)
    conflict = ana.conflict(ss.pin_conflict).id
    _add_pin(tc.option_pin(conflict, option, forbid=ss.pin_k_mode == "forbid"))


def _add_typed_pin() -> None:
    _add_pin(st.session_state.pin_text)


def _remove_pin(text: str) -> None:
    pins = state.workspace()["pins"]
    if text in pins:
        pins.remove(text)
    state.set_error("pins", None)


def _clear_pins() -> None:
    state.workspace()["pins"].clear()
    state.set_error("pins", None)


def _pin_best(texts: list[str]) -> None:
    """Adds several pins at once, checked together (one message if they do not hold)."""
    current = state.workspace()["pins"]
    new = [t for t in dict.fromkeys(texts) if t not in current]
    try:
        cached.check_pins(
            state.loaded(), state.mesh_text(), state.hardware_name(), tuple(current + new)
        )
    except tc.ToastError as exc:
        state.set_error("pins", str(exc))
        return
    current.extend(new)
    state.set_error("pins", None)


def _remove_picked_pin() -> None:
    _remove_pin(st.session_state.get("pin_to_remove", ""))


def axis_choices(m: tc.MeshSpec) -> list[str]:
    names = m.axis_names
    subsets = [c for r in range(1, len(names) + 1) for c in combinations(names, r)]
    return ["+".join(c) for c in subsets] + ["-"]


namer = DimNamer.of(ana)


def _dim_option(nd_name: str) -> str:
    nd = ana.named_dim(nd_name)
    return f"{nd.name} · {nd.size} {namer.describe(nd)} · {fmt_bytes(nd.bytes_covered)}"


def _valid_choice(key: str, options: list[str]) -> None:
    """Drops a remembered choice that the current model or mesh no longer offers."""
    if key in st.session_state and st.session_state[key] not in options:
        del st.session_state[key]


st.subheader("Pins and forbids")
dims_by_bytes = [nd.name for nd in sorted(ana.named_dims, key=lambda n: (-n.bytes_covered, n.id))]
c1, c2, c3, c4 = st.columns([4, 2, 1.6, 1.2], vertical_alignment="bottom")
_valid_choice("pin_dim", dims_by_bytes)
_valid_choice("pin_axes", axis_choices(mesh))
c1.selectbox("Named dim", dims_by_bytes, format_func=_dim_option, key="pin_dim")
c2.selectbox("Mesh axes", axis_choices(mesh), key="pin_axes", help="`-`: keep it replicated")
c3.radio("Mode", ["pin", "forbid"], key="pin_mode", horizontal=True)
c4.button("Add", key="add_dim_pin", on_click=_add_dim_pin, width="stretch")
if ana.conflicts:
    k1, k2, k3, k4 = st.columns([4, 2, 1.6, 1.2], vertical_alignment="bottom")
    _valid_choice("pin_conflict", [c.name for c in ana.conflicts])
    k1.selectbox(
        "Conflict",
        [c.name for c in ana.conflicts],
        format_func=lambda k: (
            f"{k} · {ana.conflict(k).kind} · {public_text(ana.conflict(k).description)[:70]}"
        ),
        key="pin_conflict",
    )
    n_options = len(ana.conflict(st.session_state.pin_conflict).options)
    option_names = [str(i) for i in range(n_options)] + ["none"]
    _valid_choice("pin_option", option_names)
    k2.selectbox("Option", [str(i) for i in range(n_options)] + ["none"], key="pin_option")
    k3.radio("Mode", ["pin", "forbid"], key="pin_k_mode", horizontal=True)
    k4.button("Add", key="add_conflict_pin", on_click=_add_conflict_pin, width="stretch")
t1, t2 = st.columns([7.6, 1.2], vertical_alignment="bottom")
t1.text_input(
    "Or type a pin",
    key="pin_text",
    placeholder="N3@model, tokens.1@data, !N3@data, K2=1, K2=none, !K2=1",
)
t2.button("Add", key="add_typed_pin", on_click=_add_typed_pin, width="stretch")
ui.show_error("pins")
notice = state.pop_notice("pins")
if notice:
    st.info(notice)

MANY_PINS = 12
if ws["pins"] and len(ws["pins"]) <= MANY_PINS:
    st.markdown("**Current pins** (kept across runs; forbids start with `!`)")
    for i, p in enumerate(ws["pins"]):
        a, b = st.columns([8, 1.2], vertical_alignment="center")
        icon = ":material/block:" if tc.parse_pin(p).forbid else ":material/push_pin:"
        a.markdown(f"{icon} `{p}`")
        b.button("Remove", key=f"rm_pin_{i}", on_click=_remove_pin, args=(p,), width="stretch")
    st.button("Clear all pins", key="clear_pins", on_click=_clear_pins)
elif ws["pins"]:
    # A frozen plan pins hundreds of decisions: one row and one button each would bury the page.
    parsed = [tc.parse_pin(p) for p in ws["pins"]]
    n_forbid = sum(p.forbid for p in parsed)
    n_repl = sum(
        not p.forbid and (p.kind == "dim" and not p.axes or p.kind == "option" and p.option is None)
        for p in parsed
    )
    st.markdown(
        f"**Current pins: {len(ws['pins'])}** ({len(ws['pins']) - n_forbid - n_repl} sharded or "
        f"resolved, {n_repl} kept replicated or unresolved, {n_forbid} forbids; kept across runs)"
    )
    with st.expander("Show all pins"):
        st.code(", ".join(ws["pins"]), language="text", wrap_lines=True)
    r1, r2, r3 = st.columns([5, 1.2, 1.6], vertical_alignment="bottom")
    _valid_choice("pin_to_remove", ws["pins"])
    r1.selectbox("Pin to remove", ws["pins"], key="pin_to_remove")
    r2.button("Remove", key="rm_picked_pin", on_click=_remove_picked_pin, width="stretch")
    r3.button("Clear all pins", key="clear_pins", on_click=_clear_pins, width="stretch")
else:
    st.caption("No pins: the search decides everything.")

# -- run controls -----------------------------------------------------------------------------

st.subheader("Run")
s1, s2, s3 = st.columns(3)
s1.number_input(
    "Budget (s)",
    min_value=0.2,
    max_value=600.0,
    step=1.0,
    **state.bound("budget_s"),
)
s2.number_input(
    "Seed",
    min_value=0,
    step=1,
    **state.bound("seed"),
)
s3.number_input(
    "Max simulations (0: no limit)",
    min_value=0,
    step=100,
    **state.bound("num_simulations"),
)


def _stop() -> None:
    # Settled here, in the new script run: the interrupted run records nothing after this.
    state.settle_interrupted(state.run_slot())


def _request_run() -> None:
    # A callback, so that stale messages are gone before the page above the button renders.
    st.session_state["search_requested"] = True
    state.set_error("pins", None)
    state.set_error("search", None)


b1, b2, _ = st.columns([1.3, 1, 6])
b1.button("Run search", key="run_search", type="primary", width="stretch", on_click=_request_run)
b2.button("Stop", key="stop_search", on_click=_stop, width="stretch")
ui.show_error("search")

PRICING = {"baselines": "being priced, drawn when ready"}


def baseline_lines() -> tuple[dict, dict]:
    """(step time of each baseline that fits, or None; why the others have no line). While the
    baselines are still priced in the background (~10 s on llama3-70b), the page does not wait:
    the chart says so and the lines come with a later draw."""
    priced = cached.baseline_reports_if_ready(loaded, state.mesh_text(), state.hardware_name())
    if priced is None:
        return {}, dict(PRICING)
    times = {
        name: (r.step_time_s if r.fits else None)
        for name, (strategy, r) in priced.items()
        if strategy is not None
    }
    # Baselines the chart cannot draw as a line, and why (its legend lists them greyed out).
    notes = {
        name: (
            f"does not fit ({fmt_bytes(r.peak_bytes)})"
            if strategy is not None
            else "not applicable"
        )
        for name, (strategy, r) in priced.items()
        if strategy is None or not r.fits
    }
    return times, notes


live = st.empty()


def draw(n: int) -> None:
    """Metrics, the progress chart and the best-strategy table, into the live placeholder.

    Every draw emits the same sequence of elements (an empty one where a message is not due):
    elements of an earlier draw in the same script run that a later draw does not overwrite stay
    on the page, e.g. a red "does not fit" box after the search found a plan that fits."""
    with live.container():
        status = slot["status"]
        # Three per row: five in a row of a 1280 px window cut "369.200 ms" to "369.2…".
        m = st.columns(3) + st.columns(3)
        m[0].metric(
            "Best step time",
            fmt_s_short(slot["best_step_time_s"]),
            help=f"{fmt_s(slot['best_step_time_s'])}.",
        )
        m[1].metric(
            "Peak memory / device",
            fmt_bytes(slot["best_peak_bytes"]),
            "fits" if slot["best_fits"] else "does not fit",
            delta_color="normal" if slot["best_fits"] else "inverse",
        )
        m[3].metric(
            "Iterations",
            state.iterations_shown(slot),
            help="Tree-search iterations. `seeding`: scoring the baselines and descending "
            "greedily from them, before the tree search.",
        )
        m[4].metric(
            "Evaluations",
            slot["evaluations"],
            f"{slot['evals_per_s']:.0f}/s",
            delta_color="off",
            delta_arrow="off",
        )
        m[2].metric(
            "Status", status, f"{slot['elapsed_s']:.1f} s", delta_color="off", delta_arrow="off"
        )
        st.plotly_chart(
            charts.progress_figure(slot["history"], *baseline_lines()),
            key=f"progress_{n}",
            width="stretch",
        )
        st.markdown("**Best strategy so far**")
        rows = reports.decision_rows(ana, slot["best"], slot["pins"])
        if rows:
            st.dataframe(rows, hide_index=True, width="stretch", key=f"best_table_{n}")
        else:
            st.caption("Everything replicated: no named dim sharded.")
        priced = None
        if not rows and status in ("done", "stopped") and not slot["pins"]:
            # Not waiting for the baselines: the page redraws when they arrive.
            priced = cached.baseline_reports_if_ready(
                loaded, state.mesh_text(), state.hardware_name()
            )
        if priced is not None:
            st.info(reports.why_replicated(priced))
        else:
            st.empty()
        if slot["best_fits"] is False:
            st.error(
                "NO MEMORY-FEASIBLE STRATEGY FOUND so far: the best one needs "
                f"{fmt_bytes(slot['best_peak_bytes'])} per device, over the capacity of "
                f"{state.hardware_name()}."
            )
        else:
            st.empty()


def run_search() -> None:
    n_sims = int(st.session_state.num_simulations) or None
    events = tc.search_iter(
        ana,
        mesh,
        state.hardware(),
        budget_s=float(st.session_state.budget_s),
        num_simulations=n_sims,
        seed=int(st.session_state.seed),
        pins=tuple(ws["pins"]),
    )
    with live.container():
        st.info(
            "Scoring the baselines and descending greedily from them before the tree search "
            "(seconds on large models)...",
            icon=":material/hourglass_top:",
        )
    try:
        first = next(events)  # bad pins fail here, before anything is overwritten
    except tc.ToastError as exc:
        state.set_error("search", str(exc))
        ui.show_error("search")
        return
    if slot["best"] is not None:
        slot["previous"] = state.best_record(slot)
    run = slot["runs"] + 1
    slot.update(
        status="running",
        history=[],
        pins=list(ws["pins"]),
        runs=run,
        kept_previous=False,
    )
    state.record_event(slot, run, first)
    n, last = 0, 0.0
    draw(n)
    for ev in events:
        # False once Stop (or leaving the page) settled the slot from another script run.
        if not state.record_event(slot, run, ev):
            break
        if ev.done or time.perf_counter() - last >= DRAW_EVERY_S:
            last = time.perf_counter()
            n += 1
            draw(n)
    state.finish_run(slot, run)
    state.set_setting("strategy_choice", "search best")
    # Price the best plan for the Strategy page meanwhile (~1 s on llama3-70b).
    cached.in_background("estimate", cached.estimate, loaded, slot["best"], state.mesh_text(),
                         state.hardware_name())  # fmt: skip
    # And what the Strategy page's memory section adds (the plan without remat: seconds).
    remat_views.warm(loaded, slot["best"], state.mesh_text(), state.hardware_name())
    n += 1
    draw(n)  # the settled slot: what "Stopped at iteration N" below reads too


if st.session_state.pop("search_requested", False):
    run_search()
elif slot["history"]:
    draw(0)
else:
    with live.container():
        st.info("Press **Run search**: the chart and the best strategy update while it runs.")
        st.plotly_chart(charts.progress_figure([], *baseline_lines()), key="progress_empty")


@st.fragment(run_every=ui.POLL_S)
def _await_baselines() -> None:
    """Redraws the page once the background pricing of the baselines has ended (the page then
    renders without this fragment)."""
    if (
        cached.baseline_reports_if_ready(loaded, state.mesh_text(), state.hardware_name())
        is not None
    ):
        st.rerun()


if baseline_lines()[1] == PRICING:
    _await_baselines()

# -- after a run: what changed, and pinning from the best --------------------------------------


def show_tree(slot: dict) -> None:
    """The top of the MCTS tree of the last run: where the search spent its simulations."""
    edges = slot.get("tree_top", ())
    st.subheader(
        "The search tree",
        help="The most visited actions from the root (the plan with nothing decided beyond the "
        "pins) and, under each, its most visited follow-ups. Visits: simulations that went that "
        "way (UCT sends more where the mean reward is high). Mean reward: 0.1 + 0.9 ref/(ref + t) "
        "for a plan that fits with step time t, ref = the best baseline's time (0.55 at ref); "
        "under 0.1 for plans that do not fit.",
    )
    if not edges:
        st.caption(
            "No tree search ran (every decision pinned, a zero-simulation budget, or the seeding "
            "took the whole budget)."
        )
        return
    first = [e for e in edges if e.depth == 1]
    st.caption(
        f"{sum(e.visits for e in first):,} visits through the {len(first)} most visited actions "
        "from the root, best first; size = visits, colour = mean reward. Learn's last lesson "
        "walks through one search."
    )
    t1, t2 = st.columns([1, 1])
    with t1:
        st.plotly_chart(charts.tree_figure(edges), key="tree_sunburst", width="stretch")
    with t2:
        rows = charts.tree_rows(edges)
        st.dataframe(
            [{k: r[k] for k in ("action", "visits", "mean reward")} for r in rows],
            hide_index=True,
            width="stretch",
            height=min(420, 38 + 35 * len(rows)),
        )


if slot["best"] is not None and slot["status"] in ("done", "stopped"):
    prev = slot["previous"]
    if slot["status"] == "stopped":
        st.info(f"Stopped at iteration {slot['iteration']}; the best strategy so far is kept.")
    if slot["kept_previous"] and prev is not None:
        st.info(
            f"This run's best ({fmt_s(prev['step_time_s'])}) does not beat the previous best "
            f"found with the same pins ({fmt_s(slot['best_step_time_s'])}), which stays the "
            "search best; this run's best is now the previous one."
        )
    if prev is not None:
        st.subheader("Versus the previous best")
        t_old, t_new = prev["step_time_s"], slot["best_step_time_s"]
        change = (t_new - t_old) / t_old if t_old else 0.0
        st.markdown(
            f"Step time {fmt_s(t_old)} → **{fmt_s(t_new)}** ({change:+.1%}); peak memory "
            f"{fmt_bytes(prev['peak_bytes'])} → **{fmt_bytes(slot['best_peak_bytes'])}**. "
            f"Pins then: {', '.join(f'`{p}`' for p in prev['pins']) or 'none'}; now: "
            f"{', '.join(f'`{p}`' for p in slot['pins']) or 'none'}."
        )
        diff = reports.strategy_diff(prev["strategy"], slot["best"])
        if diff:
            ui.table(diff, key="diff_table")
        else:
            st.caption("Same decisions as the previous best.")
    if reports.has_parts(slot["best"]):
        st.caption(reports.PART_NOTE)
    show_tree(slot)
    decisions = [p for p in reports.decisions_as_pins(slot["best"]) if p not in ws["pins"]]
    frozen = [p for p in reports.frozen_pins(ana, slot["best"]) if p not in ws["pins"]]
    if frozen:
        st.subheader("Pin decisions of the best strategy")
        p1, p2, p3 = st.columns([5, 1.2, 1.6], vertical_alignment="bottom")
        _valid_choice("best_decision", decisions or frozen)
        p1.selectbox("Decision", decisions or frozen, key="best_decision")
        p2.button(
            "Pin",
            key="pin_best_decision",
            on_click=lambda: _pin_best([st.session_state.best_decision]),
            width="stretch",
        )
        p3.button(
            "Pin all",
            key="pin_all_best",
            on_click=_pin_best,
            args=(frozen,),
            width="stretch",
            help="Freeze the plan: pin every decision, the replicated named dims (`@-`) and "
            "unresolved conflicts (`=none`) included; a search then has nothing left to decide.",
        )
    st.page_link(
        "app_pages/strategy.py", label="Inspect the best strategy", icon=":material/arrow_forward:"
    )

# -- fit where nothing fits (app/fit_views.py) --------------------------------------------------
fit_views.make_it_fit(loaded, slot)  # only when no plan fits: remat, more devices, smaller batch
fit_views.mesh_comparison(loaded)
