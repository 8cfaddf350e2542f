"""Small UI pieces shared by the pages: the header, error boxes, the strategy picker."""

from __future__ import annotations

import streamlit as st

import toast_core as tc
from app import cached, state
from app.cached import Loaded
from app.fmt import fmt_s


def header(title: str, caption: str = "") -> None:
    st.title(title)
    if caption:
        st.caption(caption)


def show_error(place: str) -> None:
    msg = state.error(place)
    if msg:
        st.error(msg, icon=":material/error:")


def require_loaded() -> Loaded:
    """The current model's analysis, or stop the page with a message pointing to the Model page."""
    with st.spinner("Tracing and analyzing the model..."):
        loaded = state.loaded()
    if loaded is None:
        show_error("model")
        st.info("Load a model on the Model page.")
        st.stop()
    return loaded


def context_line(loaded: Loaded) -> str:
    s = loaded.ana.summary()
    return (
        f"**{loaded.spec.title}** on mesh `{state.mesh_text()}` ({state.mesh().n_devices} devices), "
        f"`{state.hardware_name()}` · {s['named_dims']} named dims, {s['conflicts']} conflicts"
    )


#: Text put on a page beyond this many characters freezes the browser (Export on llama3-70b held
#: ~244 KB and took 20-38 s to become interactive); longer artifacts are previewed, and the
#: download buttons carry them whole.
PREVIEW_CHARS = 12_000


def preview(text: str, limit: int | None = None) -> tuple[str, str]:
    """(the head of `text` cut at a line end within `limit` characters (default PREVIEW_CHARS),
    a note saying what was left out, or '' when nothing was)."""
    limit = PREVIEW_CHARS if limit is None else limit
    if len(text) <= limit:
        return text, ""
    head = text[: text.rfind("\n", 0, limit) if "\n" in text[:limit] else limit]
    lines, shown = text.count("\n") + 1, head.count("\n") + 1
    note = (
        f"Showing the first {shown:,} of {lines:,} lines ({len(text) / 1024:,.0f} KiB in all): "
        "the download has all of it."
    )
    return head, note


def code_preview(text: str, language: str, height: int | str = "content") -> None:
    """`st.code` of a possibly huge artifact: its head and a note (see `preview`)."""
    head, note = preview(text)
    st.code(head, language=language, height=height)
    if note:
        st.caption(note)


def table(rows: list[dict], height: int | str = "auto", key: str | None = None) -> None:
    if not rows:
        st.caption("(nothing to show)")
        return
    st.dataframe(rows, hide_index=True, height=height, key=key, width="stretch")


def strategy_choices(loaded: Loaded) -> dict[str, tc.Strategy]:
    """Label -> Strategy: the search's best, the previous best, imports, then the baselines
    (not yet while the pricing process prices them: `cached.pricing_pending`)."""
    out: dict[str, tc.Strategy] = {}
    slot = state.run_slot()
    if slot["best"] is not None:
        out["search best"] = slot["best"]
    if slot["previous"] is not None:
        out["previous search best"] = slot["previous"]["strategy"]
    for name, strategy in state.workspace()["imported"].items():
        out[f"imported: {name}"] = strategy
    if cached.pricing_pending(loaded, state.mesh_text(), state.hardware_name()):
        return out
    for name, (strategy, _) in cached.baselines(loaded.key, state.mesh_text(), loaded.ana).items():
        if strategy is not None:
            out[f"baseline: {name}"] = strategy
    return out


def default_choice(loaded: Loaded, choices: dict[str, tc.Strategy]) -> str:
    """The search's best if any, else the fastest baseline that fits memory."""
    if "search best" in choices:
        return "search best"
    best, best_t = None, None
    for name, (strategy, report) in cached.baseline_reports(
        loaded, state.mesh_text(), state.hardware_name()
    ).items():
        if strategy is not None and report.fits and (best_t is None or report.step_time_s < best_t):
            best, best_t = f"baseline: {name}", report.step_time_s
    return best or next(iter(choices))


def strategy_picker(loaded: Loaded) -> tuple[str, tc.Strategy]:
    """Selectbox over `strategy_choices`; the choice is shared by Strategy, Validate and Export."""
    choices = strategy_choices(loaded)
    mesh_text, hw_name = state.mesh_text(), state.hardware_name()
    if st.session_state.strategy_choice not in choices and cached.pricing_pending(
        loaded, mesh_text, hw_name
    ):
        # A baseline is picked, or there is nothing but baselines to pick: they are needed now.
        cached.await_pricing(loaded, mesh_text, hw_name)
        choices = strategy_choices(loaded)
    if st.session_state.strategy_choice not in choices:
        state.set_setting("strategy_choice", default_choice(loaded, choices))
    wkey = state.keep("strategy_choice")

    labels = {}
    for choice, strategy in choices.items():
        try:
            r = cached.summary(loaded, strategy, mesh_text, hw_name)
        except tc.ToastError:
            labels[choice] = f"{choice} (illegal on this mesh)"
            continue
        labels[choice] = f"{choice}: {fmt_s(r.step_time_s)}{'' if r.fits else ', does not fit'}"

    st.selectbox(
        "Strategy",
        list(choices),
        key=wkey,
        format_func=labels.__getitem__,  # pure: AppTest calls it outside a run
        on_change=state.save,
        args=("strategy_choice",),
    )
    name = st.session_state.strategy_choice
    return name, choices[name]


def picked_strategy_report(loaded: Loaded) -> tuple[str, tc.Strategy, tc.CostReport]:
    """The picked strategy with its cost report; a bad strategy stops the page with a message."""
    name, strategy = strategy_picker(loaded)
    try:
        report = cached.estimate(loaded, strategy, state.mesh_text(), state.hardware_name())
    except tc.ToastError as exc:
        st.error(str(exc))
        st.stop()
    return name, strategy, report


#: Seconds between two polls of a page waiting for the pricing process: each poll is a script
#: run (the page shows "running"), and the pricing takes 10 s or more under load.
POLL_S = 2.0


@st.fragment(run_every=POLL_S)
def _rerun_once_priced(loaded: Loaded, mesh_text: str, hw_name: str) -> None:
    if not cached.pricing_pending(loaded, mesh_text, hw_name):
        st.rerun()


def rerun_when_priced(loaded: Loaded) -> bool:
    """While the pricing process prices the baselines, polls (a fragment, every `POLL_S`) and
    reruns the page when they arrive; True if they are still being priced. A page shows what
    it has meanwhile (`strategy_choices` leaves the baselines out) instead of waiting."""
    mesh_text, hw_name = state.mesh_text(), state.hardware_name()
    if not cached.pricing_pending(loaded, mesh_text, hw_name):
        return False
    _rerun_once_priced(loaded, mesh_text, hw_name)
    return True
