"""An Equinox `eqx.nn.MLP` regressor trained with optax Adam.

Equinox models are pytrees mixing arrays with Python objects (activation functions), so the
model is split with `eqx.partition` into `params` (arrays, None elsewhere) and `static`; the
traced step takes only `params` and rebuilds the model with `eqx.combine`. Pytree paths then
read like attributes, e.g. `params.layers[1].weight`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from demos.workload import Init, Workload, bind, resolve_config


@dataclass(frozen=True)
class EquinoxConfig:
    batch: int = 16  # B
    d_in: int = 64  # D
    width: int = 128  # F, hidden width
    depth: int = 2  # hidden layers
    d_out: int = 32  # O
    lr: float = 1e-3  # Adam learning rate


SIZES = {
    "tiny": EquinoxConfig(),
    "large": EquinoxConfig(batch=1024, d_in=8192, width=32768, depth=3, d_out=8192),
}


def _is_shape(x) -> bool:
    return isinstance(x, jax.ShapeDtypeStruct)


def loss_fn(params, batch: dict, *, static) -> jax.Array:
    model = eqx.combine(params, static)
    return jnp.mean((jax.vmap(model)(batch["x"]) - batch["y"]) ** 2)


def step(params, opt_state, batch: dict, *, static, tx: optax.GradientTransformation):
    """One Adam step: returns (new_params, new_opt_state, loss)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, static=static)
    updates, opt_state = tx.update(grads, opt_state, params)
    return eqx.apply_updates(params, updates), opt_state, loss


def forward(params, x: jax.Array, *, static) -> jax.Array:
    """[B, D] -> [B, O]; eqx.nn.MLP maps one example, so vmap over B."""
    return jax.vmap(eqx.combine(params, static))(x)


def make_equinox(size: str = "tiny", train: bool = True, **overrides) -> Workload:
    """Equinox MLP as a Workload: `step(params, opt_state, batch)` or `forward(params, x)`."""
    cfg = resolve_config("make_equinox", SIZES, size, overrides)
    new_model = functools.partial(
        eqx.nn.MLP, in_size=cfg.d_in, out_size=cfg.d_out, width_size=cfg.width, depth=cfg.depth
    )
    tx = optax.adam(cfg.lr)
    init = Init(abstract=size != "tiny")
    key = jax.random.PRNGKey(0)
    params = init.run(lambda k: eqx.filter(new_model(key=k), eqx.is_array), key)
    opt_state = init.run(tx.init, params)
    batch = {"x": init.normal((cfg.batch, cfg.d_in)), "y": init.normal((cfg.batch, cfg.d_out))}
    # The static half never depends on values, so take it from a shapes-only model.
    shapes_only = eqx.filter_eval_shape(new_model, key=key)
    static = eqx.partition(shapes_only, _is_shape)[1]
    dims = f"B={cfg.batch} D={cfg.d_in} F={cfg.width} depth={cfg.depth} O={cfg.d_out}"
    if train:
        fn, args = bind(step, static=static, tx=tx), (params, opt_state, batch)
        return Workload("equinox", f"Equinox MLP, optax Adam step, {dims}", fn, args, (0, 1), cfg)
    fn, args = bind(forward, static=static), (params, batch["x"])
    return Workload("equinox", f"Equinox MLP, forward, {dims}", fn, args, (0,), cfg)
