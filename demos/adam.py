"""Hand-written Adam, shared by the zoo's train steps.

Written out rather than taken from optax so the traced program is plain elementwise ops over
params-shaped tensors: the optimizer state (`mu`, `nu`) has exactly the params' dims, which is
what makes it shard like the params.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def adam_init(params: Any) -> dict:
    """Zero moments shaped like `params` plus an int32 step counter."""

    def zeros():
        return jax.tree.map(jnp.zeros_like, params)

    return {"mu": zeros(), "nu": zeros(), "step": jnp.zeros((), jnp.int32)}


def adam_update(
    params: Any, grads: Any, state: dict, lr: float, b1=0.9, b2=0.999, eps=1e-8
) -> tuple[Any, dict]:
    """One bias-corrected Adam step (Kingma & Ba 2015, Alg. 1); params keep their dtype."""
    step = state["step"] + 1
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["mu"], grads)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["nu"], grads)
    t = step.astype(jnp.float32)
    lr_t = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
    new_params = jax.tree.map(
        lambda p, m, v: (p - lr_t * m / (jnp.sqrt(v) + eps)).astype(p.dtype), params, mu, nu
    )
    return new_params, {"mu": mu, "nu": nu, "step": step}
