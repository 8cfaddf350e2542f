"""Export page: strategy JSON (download and import), a PartitionSpec snippet, a report."""

from __future__ import annotations

import streamlit as st

import toast_core as tc
from app import cached, reports, state, ui
from app.fmt import fmt_bytes, fmt_s

ui.header(
    "Export",
    "Take a strategy out of the explorer: as JSON (and back in), as PartitionSpecs ready to paste "
    "into a `jax.jit`, or as a self-contained report.",
)
loaded = ui.require_loaded()
ana = loaded.ana
mesh = state.mesh()
st.markdown(ui.context_line(loaded))
name, strategy, report = ui.picked_strategy_report(loaded)
stem = loaded.spec.title.split(" ")[0].replace(".py:", "_").replace(":", "_")

st.subheader("Strategy JSON")
strategy_json = strategy.to_json(mesh, program=ana.program.name)
st.download_button(
    "Download strategy JSON",
    strategy_json,
    file_name=f"{stem}_strategy.json",
    mime="application/json",
    key="dl_json",
)
ui.code_preview(strategy_json, "json", height=260)


def _import(text: str, label: str) -> None:
    try:
        imported = tc.Strategy.from_json(text, ana)
        imported.validate(ana, mesh)
    except tc.ToastError as exc:
        state.set_error("import", str(exc))
        return
    key = imported.name or label
    state.workspace()["imported"][key] = imported
    state.set_setting("strategy_choice", f"imported: {key}")
    state.set_error("import", None)
    state.notify("import", f"Imported `{key}`; it is now the selected strategy.")


def _import_text() -> None:
    _import(st.session_state.import_text, "pasted")


def _import_upload() -> None:
    upload = st.session_state.get("import_file")
    if upload is None:
        state.set_error("import", "expected an uploaded .json file, got nothing")
        return
    _import(upload.getvalue().decode("utf-8", errors="replace"), upload.name.rsplit(".", 1)[0])


with st.expander("Import a strategy", expanded=bool(state.error("import"))):
    i1, i2 = st.columns(2)
    with i1:
        st.file_uploader("Strategy JSON file", type=["json"], key="import_file")
        st.button("Import file", key="import_file_button", on_click=_import_upload)
    with i2:
        st.text_area("...or paste JSON", key="import_text", height=140)
        st.button("Import text", key="import_text_button", on_click=_import_text)
ui.show_error("import")
notice = state.pop_notice("import")
if notice:
    st.success(notice)

#: Above this many inputs and outputs, the specs and the report (about a millisecond per tensor:
#: ~20 s on llama3-70b) wait for a click, so that the page opens at once.
EAGER_TENSORS = 2_000
n_tensors = len(set(ana.program.inputs + ana.program.outputs))
prepared = st.session_state.setdefault("export_prepared", set())
export_key = (loaded.key, state.mesh_text(), cached.strategy_key(strategy))
if n_tensors > EAGER_TENSORS and export_key not in prepared:
    st.subheader("PartitionSpecs and report")
    st.caption(
        f"{n_tensors:,} inputs and outputs: writing their PartitionSpecs and the report takes "
        "a while (once per strategy)."
    )
    if not st.button("Prepare the PartitionSpecs and the report", key="prepare_export"):
        st.stop()
    prepared.add(export_key)

st.subheader("PartitionSpecs")
in_specs, out_specs = cached.partition_specs(loaded, strategy, state.mesh_text())
fn_name = getattr(loaded.fn, "__name__", "step") or "step"
if not fn_name.isidentifier():
    fn_name = "step"
snippet = reports.partition_spec_snippet(in_specs, out_specs, mesh, fn_name)
st.caption(
    "Inputs and outputs only. The strategy's cuts also need sharding constraints inside the "
    "function: `tc.shard(fn, ana, strategy, mesh)` replays the program with them."
)
st.download_button(
    "Download snippet", snippet, file_name=f"{stem}_specs.py", mime="text/x-python", key="dl_py"
)
ui.code_preview(snippet, "python", height=420)

st.subheader("Report")
bl = cached.baseline_reports(loaded, state.mesh_text(), state.hardware_name())
baseline_rows = [
    {
        "strategy": b,
        "step time": fmt_s(r.step_time_s),
        "compute": fmt_s(r.compute_s),
        "communication": fmt_s(r.comm_s),
        "peak memory": fmt_bytes(r.peak_bytes),
        "fits": "yes" if r.fits else "NO",
    }
    for b, (s, r) in bl.items()
    if s is not None
]
chosen = dict(strategy.options)
conflict_rows = [
    {
        "conflict": c.name,
        "kind": c.kind,
        "description": c.description.replace("|", "/"),
        "chosen": f"option {chosen[c.id]}" if c.id in chosen else "unresolved",
    }
    for c in ana.conflicts
]
text = reports.markdown_report(
    title=loaded.spec.title,
    description=loaded.description,
    summary=ana.summary(),
    mesh=mesh,
    hw_name=state.hardware_name(),
    strategy=strategy,
    report=report,
    shardings=cached.value_rows(loaded, strategy, state.mesh_text()),
    baselines=baseline_rows,
    strategy_json=strategy_json,
    conflicts=conflict_rows,
)
st.download_button(
    "Download report (Markdown)",
    text,
    file_name=f"{stem}_report.md",
    mime="text/markdown",
    key="dl_report",
)
with st.expander("Preview the report"):
    head, note = ui.preview(text)
    if note:
        st.caption(note)
    st.markdown(head)
