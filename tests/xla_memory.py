"""Predicted and compiled per-device memory of a small program under the replicated plan, for the
tests that hold the CPU memory view to XLA's `memory_analysis()`."""

import jax
import jax.numpy as jnp

import toast_core as tc

#: XLA sizes its temporary block up to the end of its top buffer; the model ends it at its
#: smallest buffer's end (`buffers.top_padding`), under 64 bytes off when XLA's top is another.
ALIGN_SLACK = 64


def replicated_memory(fn, args, mesh: tc.MeshSpec) -> tuple[float, float]:
    """(predicted, compiled) bytes per device of `fn` replicated on `mesh` (compile only)."""
    ana = tc.analyze(tc.trace(fn, *args))
    check = tc.validate(
        fn, args, ana, tc.Strategy(name="replicated"), tc.jax_mesh(mesh), "tpu-v5e",
        check_numerics=False,
    )  # fmt: skip
    return check.predicted_memory_bytes, check.compiled_memory_bytes


def sgd_of_mean_matvec(params, batch):
    """An SGD step on `mean(x @ w)`: its gradient is x times a constant (fuzz seed 18 #195), the
    smallest train step the memory tests hold to XLA."""

    def loss(p):
        return jnp.mean(batch["x1"] @ p["w2"])

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value
