"""Validate page: compile the strategy with XLA on simulated devices; predicted vs compiled."""

from __future__ import annotations

import jax
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
results = st.session_state.validations
shape_only = not loaded.is_concrete
with_twin = shape_only and cached.has_twin(loaded.spec)

if shape_only:
    st.info(
        "This workload carries shapes only (`jax.ShapeDtypeStruct`s). **Compile at the real size** "
        "compiles the plan with XLA on random arrays of the real shapes and compares flops, "
        "collectives and memory with the prediction; numerics are not compared there (the "
        "unsharded reference is too slow on CPU). "
        + (
            "**Check numerics on the twin** runs the same plan (the same named dims by name) on a "
            "scaled-down twin of the model (same layers and heads, small widths, float32) and "
            "compares it with the unsharded twin."
            if with_twin
            else "This model has no scaled-down twin: to check numerics, load a small size of it "
            "on the Model page."
        )
    )
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


def _key(mode: str) -> tuple:
    return (*state.run_key(), cached.strategy_key(strategy), mode)


def run_validation(mode: str) -> None:
    """mode "real": the loaded program (numerics only if it carries real arrays); "twin": the
    plan moved by name onto the scaled-down twin, numerics included."""
    what = "the scaled-down twin" if mode == "twin" else f"`{name}`"
    with st.status(
        f"Compiling {what} with XLA on {mesh.n_devices} devices...", expanded=True
    ) as box:
        target = loaded
        plan = strategy
        try:
            if mode == "twin":
                st.write("Building the twin (real arrays) and moving the plan over by name.")
                target = cached.twin(loaded.spec)
                plan = tc.Strategy.from_json(
                    strategy.to_json(mesh, program=loaded.ana.program.name), target.ana
                )
                plan.validate(target.ana, mesh)
            st.write("Sharding the function: in/out shardings and constraints at the cuts.")
            jax_mesh = tc.jax_mesh(mesh, devices)
            st.write(
                "Lowering, compiling, running, and running the unsharded function."
                if target.is_concrete
                else "Lowering and compiling (no run: shapes only)."
            )
            report = tc.validate(
                target.fn,
                target.args,
                target.ana,
                plan,
                jax_mesh,
                state.hardware(),
                check_numerics=target.is_concrete,
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
        results[_key(mode)] = (report, target.is_concrete, target.description)
        box.update(label="Compiled and checked", state="complete", expanded=False)


b1, b2, _ = st.columns([1.6, 1.9, 3])
if b1.button(
    "Compile at the real size" if shape_only else "Compile and validate",
    key="run_validate",
    type="primary",
    help="About 40 s for GPT-2 small shapes on 8 simulated devices." if shape_only else None,
):
    run_validation("real")
if with_twin and b2.button(
    "Check numerics on the twin",
    key="run_validate_twin",
    help="About a minute for the GPT-2 twin (12 layers, compiled sharded and unsharded).",
):
    run_validation("twin")
ui.show_error("validate")

shown = [(mode, results[_key(mode)]) for mode in ("twin", "real") if _key(mode) in results]
if not shown:
    st.info(
        "Press **Compile at the real size** (about 40 s on GPT-2 small shapes)"
        + (" or **Check numerics on the twin**." if with_twin else ".")
        if shape_only
        else "Press **Compile and validate** (a few seconds on the small demos)."
    )
    st.stop()


def show(mode: str, report, numerics_checked: bool, description: str) -> None:
    if mode == "twin":
        st.subheader("Numerics on the scaled-down twin")
        st.caption(description)
    elif shape_only:
        st.subheader("Compiled at the real size")
    if not numerics_checked:
        st.caption("Numerics not compared at this size (shapes only).")
    elif report.numerics_ok:
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
        fmt = fmt_bytes if "bytes" in quantity else (lambda x: f"{x:.4g}")
        rows.append(
            {
                "quantity": quantity,
                "predicted": fmt(predicted),
                "compiled (XLA)": fmt(compiled),
                "predicted / compiled": fmt_ratio(predicted / compiled if compiled else None),
            }
        )
    st.markdown("**Predicted vs compiled (per device)**")
    ui.table(rows, key=f"validation_table_{mode}")
    st.caption(
        "Collective bytes are compared as XLA's CPU backend lowers them (a reduce-scatter becomes "
        "an all-reduce plus a slice), and a loop body's flops and collectives once, as XLA reports "
        "them. Memory is argument + output + temp - aliased bytes."
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


for mode, (report, numerics_checked, description) in shown:
    show(mode, report, numerics_checked, description)
