"""Learn page: guided lessons, with numbers computed by the engine on the lesson's model."""

from __future__ import annotations

import streamlit as st

import toast_core as tc
from app import cached, state, ui
from app.lessons import LESSONS, LessonContext

ui.header(
    "Learn",
    "Six short lessons on sharding, each set up in the explorer: load one, then follow the "
    "pointers. Every number below is computed by the engine for the lesson's model.",
)

titles = [lesson.title for lesson in LESSONS]
st.radio(
    "Lesson",
    range(len(LESSONS)),
    format_func=lambda i: titles[i],
    **state.bound("lesson"),
    horizontal=True,
    label_visibility="collapsed",
)
lesson = LESSONS[int(st.session_state.lesson)]


def context_for(loaded: cached.Loaded) -> LessonContext:
    mesh_text = str(cached.mesh_of(lesson.mesh_text))
    return LessonContext(
        loaded=loaded,
        mesh=cached.mesh_of(mesh_text),
        hw_name=lesson.hardware,
        estimate=lambda s: cached.estimate(loaded, s, mesh_text, lesson.hardware),
        estimate_on=lambda s, hw: cached.estimate(loaded, s, mesh_text, hw),
        baselines=lambda: cached.baselines(loaded.key, mesh_text, loaded.ana),
        quick_search=lambda pins: cached.quick_search(
            loaded.key, mesh_text, lesson.hardware, tuple(pins), loaded.ana
        ),
        short_search=lambda n, seed: cached.short_search(
            loaded.key, mesh_text, lesson.hardware, n, seed, loaded.ana
        ),
    )


def _load_lesson() -> None:
    try:
        ctx = context_for(cached.load(lesson.spec))
        pins = lesson.pins(ctx)
    except tc.ToastError as exc:
        state.set_error("lesson", str(exc))
        return
    if state.load_lesson(lesson.spec, lesson.mesh_text, lesson.hardware, pins):
        state.set_error("lesson", None)
        shown = ", ".join(f"`{p}`" for p in pins) or "none"
        state.notify(
            "lesson",
            f"Loaded {lesson.spec.title} on `{lesson.mesh_text}` ({lesson.hardware}); pins: {shown}.",
        )
    else:
        state.set_error("lesson", state.error("model") or state.error("mesh") or "loading failed")


st.subheader(lesson.title)
st.markdown(f"*{lesson.intro}*")
st.markdown(
    f"Setup: **{lesson.spec.title}** on mesh `{lesson.mesh_text}`, hardware `{lesson.hardware}`."
)
st.button("Load this lesson", key="load_lesson", type="primary", on_click=_load_lesson)
ui.show_error("lesson")
notice = state.pop_notice("lesson")
if notice:
    st.success(notice)

with st.spinner(f"Analyzing {lesson.spec.title} and pricing its strategies..."):
    try:
        loaded = cached.load(lesson.spec)
        body = lesson.body(context_for(loaded))
    except tc.ToastError as exc:
        st.error(str(exc))
        st.stop()
st.markdown(body)

st.markdown("**What to look at**")
for page, what in lesson.look:
    st.page_link(page, label=what, icon=":material/arrow_forward:")
