"""Model page: choose a zoo model or a user file, the mesh and the hardware."""

from __future__ import annotations

import streamlit as st

import toast_core as tc
from app import cached, graph_views, state, ui
from app.cached import ModelSpec
from app.fmt import fmt_bytes
from app.lessons import LESSONS
from app.user_model import file_digest, save_upload, split_target
from demos import MODEL_ZOO, SIZES

ui.header(
    "Model",
    "Pick a JAX program to shard, the device mesh and the hardware. Analysis and search need no "
    "devices; validation compiles on simulated CPU devices.",
)


def _load_zoo() -> None:
    spec = ModelSpec(
        "zoo",
        st.session_state.zoo_model,
        st.session_state.zoo_size,
        bool(st.session_state.zoo_train),
    )
    if state.commit_model(spec) is not None:
        state.notify("model", f"Loaded {spec.title}.")


def _load_file_target() -> None:
    _load_target(st.session_state.file_target)


def _load_target(target: str) -> None:
    try:
        path, function = split_target(target)
        spec = ModelSpec("file", path=path, function=function, digest=file_digest(path))
    except tc.ToastError as exc:
        state.set_error("model", str(exc))
        return
    if state.commit_model(spec) is not None:
        state.notify("model", f"Loaded {spec.title}.")


def _load_upload() -> None:
    upload = st.session_state.get("upload_file")
    function = (st.session_state.upload_function or "").strip()
    if upload is None:
        state.set_error("model", "expected an uploaded .py file, got nothing")
        return
    # Loaded from where it was saved; the "File and function" box keeps what the user typed
    # there (the saved copy's temp path means nothing to them).
    path = save_upload(upload.name, upload.getvalue())
    _load_target(f"{path}:{function}")


def _apply_mesh() -> None:
    state.save("mesh_input")
    state.commit_mesh(st.session_state.mesh_input)


def _apply_hardware() -> None:
    state.save("hardware_input")
    st.session_state.hardware = st.session_state.hardware_input


left, right = st.columns([3, 2], gap="large")

with left:
    st.subheader("Program")
    st.radio(
        "Source",
        ["Zoo model", "Python file"],
        **state.bound("source"),
        horizontal=True,
    )
    if st.session_state.source == "Zoo model":
        c1, c2, c3 = st.columns([2, 2, 1.4], vertical_alignment="bottom")
        c1.selectbox(
            "Zoo model",
            list(MODEL_ZOO),
            **state.bound("zoo_model"),
        )
        sizes = list(SIZES[st.session_state.zoo_model])
        if st.session_state.zoo_size not in sizes:
            state.set_setting("zoo_size", sizes[0])
        c2.selectbox(
            "Size",
            sizes,
            **state.bound("zoo_size"),
            help="tiny and small carry real arrays; larger sizes are shapes only (validation compiles "
            "them at the real size, and checks numerics on a scaled-down twin where one exists).",
        )
        c3.checkbox(
            "Train step",
            **state.bound("zoo_train"),
            help="A full training step (forward, backward, optimizer update), else the forward.",
        )
        st.button("Load model", type="primary", key="load_zoo", on_click=_load_zoo)
    else:
        st.markdown(
            "A Python file with a function returning `(fn, example_args)`; example args may be "
            "arrays or `jax.ShapeDtypeStruct`s. The explorer **executes** this file."
        )
        st.text_input(
            "File and function",
            **state.bound("file_target"),
            placeholder="path/to/model.py:make",
        )
        st.button("Load file", type="primary", key="load_file", on_click=_load_file_target)
        with st.expander("...or upload a file"):
            st.file_uploader("Model file", type=["py"], key="upload_file")
            st.text_input(
                "Function",
                **state.bound("upload_function"),
            )
            st.button("Load upload", key="load_upload", on_click=_load_upload)

    ui.show_error("model")
    notice = state.pop_notice("model")
    if notice:
        st.success(notice)

with right:
    st.subheader("Mesh and hardware")
    st.text_input(
        "Mesh axes",
        key=state.keep("mesh_input"),
        on_change=_apply_mesh,
        help="`name=size` items, major first; `:slow` marks a cross-host (DCN/InfiniBand) axis.",
    )
    ui.show_error("mesh")
    presets = list(tc.HARDWARE_PRESETS)
    st.selectbox(
        "Hardware",
        presets,
        key=state.keep("hardware_input"),
        on_change=_apply_hardware,
    )
    hw = state.hardware()
    st.caption(
        f"`{state.hardware_name()}`: {hw.peak_flops_per_s:.3g} FLOP/s, HBM "
        f"{fmt_bytes(hw.hbm_capacity_bytes)} at {hw.hbm_bytes_per_s:.3g} B/s per chip."
    )

loaded = ui.require_loaded()
cached.warm(loaded, state.mesh_text(), state.hardware_name())
cached.preload(LESSONS[int(st.session_state.lesson)].spec)  # the Learn page's model
graph_views.warm(loaded)  # the Named dims page's tables and names
s = loaded.ana.summary()
st.divider()
st.subheader(loaded.spec.title)
st.caption(loaded.description)
m = st.columns(6)
m[0].metric("Ops", s["ops"])
m[1].metric("Tensor dims", s["tensor_dims"])
m[2].metric("Named dims", s["named_dims"], help="The decisions NDA leaves: one per named dim.")
m[3].metric("Layer groups", s["dim_groups"], help="Named dims repeated across identical layers.")
m[4].metric("Conflicts", s["conflicts"])
m[5].metric("Diagnostics", s["diagnostics"])
kinds = ", ".join(f"{n} {k}" for k, n in s["conflicts_by_kind"].items()) or "none"
mesh = state.mesh()
st.markdown(
    f"NDA turns **{s['tensor_dims']} tensor dims** into **{s['named_dims']} named dims**; "
    f"conflicts: {kinds}. Mesh `{mesh}` has {mesh.n_devices} devices; loaded in "
    f"{loaded.load_s:.2f} s."
)
if not loaded.is_concrete:
    st.info(
        "This workload carries shapes only (nothing is allocated): analysis, search and export "
        "work as is; the Validate page compiles it at the real size, and checks numerics on a "
        "scaled-down twin where the model has one."
    )
for d in loaded.ana.diagnostics:
    st.warning(d)
with st.expander("Program inputs and outputs"):
    prog = loaded.ana.program
    inputs = set(prog.inputs)  # not the tuple: 2,900 lookups on llama3-70b
    ui.table(
        [
            {
                "value": prog.values[v].name,
                "role": prog.values[v].role if v in inputs else "output",
                "shape": str(list(prog.values[v].shape)),
                "dtype": prog.values[v].dtype,
                "bytes": fmt_bytes(prog.values[v].nbytes),
            }
            for v in dict.fromkeys(prog.inputs + prog.outputs)
        ],
        height=300,
    )
