"""The Strategy page's memory section: the plan's per-device memory timeline, and with remat in
the plan, the same plan without it (two curves against the usable memory) and what each remat
group recomputes and costs (`tc.remat_comparison`)."""

from __future__ import annotations

import streamlit as st

import toast_core as tc
from app import cached, charts, fit_charts, state, ui
from app.cached import Loaded
from app.fmt import fmt_bytes, fmt_s, fmt_s_short

#: Programs with more ops than this price the plan without remat (and with full remat) in the
#: background: ~2-4 s on llama3-70b, which the page does not wait for; smaller ones at once.
FOREGROUND_OPS = 2_000


@st.cache_resource(show_spinner=False, max_entries=32)
def _comparison(key: str, mesh_text: str, hw_name: str, skey: tuple, _ana, _strategy):
    return tc.remat_comparison(_ana, _strategy, cached.mesh_of(mesh_text), tc.hardware(hw_name))


def comparison(loaded: Loaded, strategy: tc.Strategy, mesh_text: str, hw_name: str):
    """`tc.remat_comparison` of the plan (cached); None while a large program's is still priced
    in the background (`cached.if_ready`)."""
    skey = cached.strategy_key(strategy)
    args = (loaded.key, mesh_text, hw_name, skey, loaded.ana, strategy)
    if len(loaded.ana.program.ops) <= FOREGROUND_OPS:
        return _comparison(*args)
    return cached.if_ready("remat", (loaded.key, mesh_text, hw_name, skey), _comparison, *args)


def warm(loaded: Loaded, strategy: tc.Strategy, mesh_text: str, hw_name: str) -> None:
    """Starts pricing what the Strategy page's memory section needs for `strategy` (after a
    search, while the user still reads the Search page); small programs price it on the page."""
    if len(loaded.ana.program.ops) <= FOREGROUND_OPS:
        return
    if strategy.remat:
        comparison(loaded, strategy, mesh_text, hw_name)
    else:
        _full_remat_report(loaded, strategy, mesh_text, hw_name)


@st.fragment(run_every=1.0)
def _await(name: str, key: tuple) -> None:
    """Redraws the page once the background pricing `name` has ended."""
    if cached.is_ready(name, key):
        st.rerun()


def memory_section(loaded: Loaded, strategy: tc.Strategy, report: tc.CostReport) -> None:
    """Per-device memory over the step; with the plan's remat beside the same plan without it,
    and which layers recompute at what cost."""
    st.subheader("Per-device memory")
    mesh_text, hw_name = state.mesh_text(), state.hardware_name()
    prog = loaded.ana.program
    peak_label = prog.ops[report.peak_op].where() if 0 <= report.peak_op < len(prog.ops) else ""
    skey = cached.strategy_key(strategy)

    def plain_figure():
        """The plan's own memory timeline (cached per plan)."""
        return cached.figure(
            "memory",
            (loaded.key, mesh_text, hw_name, skey),
            lambda: charts.memory_figure(
                report.memory_timeline,
                report.capacity_bytes,
                report.persistent_bytes,
                report.peak_op,
                peak_label,
            ),
        )

    if not strategy.remat:
        st.plotly_chart(plain_figure(), width="stretch")
        st.caption(
            f"Inputs (parameters, optimizer state, data) take {fmt_bytes(report.persistent_bytes)} "
            f"per device; the peak {fmt_bytes(report.peak_bytes)} is reached at "
            f"{peak_label or 'the end'}." + _full_remat_hint(loaded, strategy, report)
        )
        return
    cmp = comparison(loaded, strategy, mesh_text, hw_name)
    if cmp is None:
        st.plotly_chart(plain_figure(), width="stretch")
        st.info(
            "Pricing the same plan without remat, and what each remat group recomputes: "
            "drawn here when ready (a few seconds on large programs).",
            icon=":material/hourglass_top:",
        )
        _await("remat", (loaded.key, mesh_text, hw_name, skey))
        return
    plain = cmp.without_remat
    st.plotly_chart(
        fit_charts.remat_memory_figure(
            report.memory_timeline, plain.memory_timeline, report.capacity_bytes
        ),
        width="stretch",
        key="remat_memory",
    )
    # Two per row: a 1280 px window leaves ~190 px for four, too few for "+127.6 ms".
    m = st.columns(2) + st.columns(2)
    m[0].metric(
        "Recompute flops",
        f"{cmp.recompute_flops_fraction:.1%}",
        help="Forward flops run again in the backward, over the plan's flops per device.",
    )
    m[1].metric(
        "Step time vs no remat",
        _signed_s(cmp.step_time_delta_s, short=True),
        help=f"Exactly {_signed_s(cmp.step_time_delta_s)}.",
    )
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
    mesh_text, hw_name = state.mesh_text(), state.hardware_name()
    r = _full_remat_report(loaded, strategy, mesh_text, hw_name)
    if r is None:
        _await("full-remat", (loaded.key, mesh_text, hw_name, cached.strategy_key(strategy)))
        return " What full remat would do to this plan is being priced: shown here when ready."
    return (
        f" No remat in this plan; with every layer group recomputed (`remat[...]=full`) the peak "
        f"would be {fmt_bytes(r.peak_bytes)} ({_signed_bytes(r.peak_bytes - report.peak_bytes)}) "
        f"and the step {fmt_s(r.step_time_s)} ({_signed_s(r.step_time_s - report.step_time_s)})."
    )


def _full_remat_report(
    loaded: Loaded, strategy: tc.Strategy, mesh_text: str, hw_name: str
) -> tc.CostReport | None:
    """The cost report of the plan with every remat group on `full` (None while a large
    program's is priced in the background)."""
    full = strategy.with_remat(loaded.ana, "full")
    if len(loaded.ana.program.ops) <= FOREGROUND_OPS:
        return cached.estimate(loaded, full, mesh_text, hw_name)
    key = (loaded.key, mesh_text, hw_name, cached.strategy_key(strategy))
    return cached.if_ready("full-remat", key, cached.estimate, loaded, full, mesh_text, hw_name)


def _signed_s(x: float, short: bool = False) -> str:
    return ("+" if x >= 0 else "-") + (fmt_s_short if short else fmt_s)(abs(x))


def _signed_bytes(x: float) -> str:
    return ("+" if x >= 0 else "-") + fmt_bytes(abs(x))
