"""Validate page: compile the strategy with XLA on simulated devices; predicted vs compiled."""

from __future__ import annotations

import jax
import numpy as np
import streamlit as st

import toast_core as tc
from app import cached, state, ui
from app.fmt import fmt_bytes, fmt_ratio

ui.header(
    "Validate",
    "XLA is the judge: the strategy is applied to the real function (`jax.jit` with "
    "NamedShardings and sharding constraints), compiled for simulated CPU devices, run, and "
    "compared with the unsharded function and with the cost model's predictions.",
)
loaded = ui.require_loaded()
mesh = state.mesh()
st.markdown(ui.context_line(loaded))
name, strategy = ui.strategy_picker(loaded)

devices = jax.devices()
key = (*state.run_key(), cached.strategy_key(strategy))
results = st.session_state.validations

if not loaded.is_concrete:
    st.info(
        "This workload carries shapes only (`jax.ShapeDtypeStruct`): validation needs real "
        "arrays. Load the `tiny` size of the model on the Model page."
    )
    st.stop()
if mesh.n_devices > len(devices):
    st.error(
        f"Mesh `{mesh}` needs {mesh.n_devices} devices but this process has {len(devices)} "
        f"({devices[0].platform} devices). Use a mesh of at most {len(devices)} devices here, or "
        "start the explorer with XLA_FLAGS=--xla_force_host_platform_device_count=N."
    )
    st.stop()
try:
    strategy.validate(loaded.ana, mesh)
except tc.ToastError as exc:
    st.error(str(exc))
    st.stop()

st.caption(
    f"{len(devices)} {devices[0].platform} devices available; the mesh uses {mesh.n_devices}. "
    "Wall time on simulated devices means nothing and is not measured."
)


def run_validation() -> None:
    with st.status(
        f"Compiling `{name}` with XLA on {mesh.n_devices} devices...", expanded=True
    ) as box:
        st.write("Sharding the function: in/out shardings and constraints at the cuts.")
        jax_mesh = jax.sharding.Mesh(
            np.array(devices[: mesh.n_devices]).reshape(mesh.axis_sizes), mesh.axis_names
        )
        st.write("Lowering, compiling, running, and running the unsharded function.")
        try:
            report = tc.validate(
                loaded.fn, loaded.args, loaded.ana, strategy, jax_mesh, state.hardware()
            )
        except tc.ToastError as exc:
            box.update(label="Validation failed", state="error")
            state.set_error("validate", str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - XLA errors are shown, never as tracebacks
            box.update(label="Compilation failed", state="error")
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            state.set_error("validate", f"XLA failed: {type(exc).__name__}: {first}"[:500])
            return
        state.set_error("validate", None)
        results[key] = report
        box.update(label="Compiled and checked", state="complete", expanded=False)


if st.button("Compile and validate", key="run_validate", type="primary"):
    run_validation()
ui.show_error("validate")

report = results.get(key)
if report is None:
    st.info("Press **Compile and validate** (a few seconds on the tiny demos).")
    st.stop()

if report.numerics_ok:
    st.success(
        f"Numerics match the unsharded function (max abs error {report.max_abs_error:.2e}, "
        "rtol 1e-4, atol 1e-5)."
    )
else:
    st.error(
        f"Numerics differ from the unsharded function: max abs error {report.max_abs_error:.3e}."
    )

rows = []
for quantity, predicted, compiled in report.rows():
    is_bytes = "bytes" in quantity
    show = fmt_bytes if is_bytes else (lambda x: f"{x:.4g}")
    rows.append(
        {
            "quantity": quantity,
            "predicted": show(predicted),
            "compiled (XLA)": show(compiled),
            "predicted / compiled": fmt_ratio(predicted / compiled if compiled else None),
        }
    )
st.subheader("Predicted vs compiled (per device)")
ui.table(rows, key="validation_table")
st.caption(
    "Collective bytes are compared as XLA's CPU backend lowers them (a reduce-scatter becomes an "
    "all-reduce plus a slice), and a loop body's flops and collectives once, as XLA reports them. "
    "Memory is argument + output + temp - aliased bytes."
)
target = {k: v for k, v in report.predicted_collective_bytes_target.items() if v}
if target:
    st.markdown(
        "On TPU/GPU the plan would move: "
        + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in target.items())
        + " per device."
    )
with st.expander("Compiled HLO (first 400 lines)"):
    st.code("\n".join(report.hlo_text.splitlines()[:400]), language="text")
