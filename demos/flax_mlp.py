"""A Flax (linen) MLP classifier trained with optax AdamW.

The zoo's check that third-party pytrees trace like hand-written ones: params arrive as
Flax's nested `{"params": {"Dense_0": {"kernel", "bias"}, ...}}` and optimizer state as optax's
named tuples (`ScaleByAdamState(count, mu, nu)`), with AdamW's decoupled weight decay.
"""

from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from demos.workload import Init, Workload, bind, resolve_config


@dataclass(frozen=True)
class FlaxConfig:
    batch: int = 16  # B
    d_in: int = 64  # D
    hidden: int = 128  # F, width of each hidden layer
    depth: int = 2  # hidden layers, each Dense -> LayerNorm -> relu
    n_classes: int = 16  # C
    lr: float = 1e-3  # AdamW learning rate
    weight_decay: float = 1e-4  # AdamW decoupled weight decay
    dtype: str = "float32"


SIZES = {
    "tiny": FlaxConfig(),
    "large": FlaxConfig(batch=1024, d_in=4096, hidden=16384, depth=4, n_classes=1024),
}


class MLP(nn.Module):
    hidden: int
    depth: int
    n_classes: int
    dtype: str = "float32"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Logits [B, C] for features [B, D]."""
        for _ in range(self.depth):
            x = nn.Dense(self.hidden, param_dtype=self.dtype)(x)
            x = nn.relu(nn.LayerNorm(param_dtype=self.dtype)(x))
        return nn.Dense(self.n_classes, param_dtype=self.dtype)(x)


def loss_fn(params, batch: dict, *, model: MLP) -> jax.Array:
    logits = model.apply(params, batch["x"]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


def step(params, opt_state, batch: dict, *, model: MLP, tx: optax.GradientTransformation):
    """One AdamW step: returns (new_params, new_opt_state, loss)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, model=model)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def forward(params, x: jax.Array, *, model: MLP) -> jax.Array:
    return model.apply(params, x)


def make_flax(size: str = "tiny", train: bool = True, **overrides) -> Workload:
    """Flax MLP as a Workload: `step(params, opt_state, batch)` or `forward(params, x)`."""
    cfg = resolve_config("make_flax", SIZES, size, overrides)
    model = MLP(cfg.hidden, cfg.depth, cfg.n_classes, cfg.dtype)
    tx = optax.adamw(cfg.lr, weight_decay=cfg.weight_decay)
    init = Init(abstract=size != "tiny", dtype=cfg.dtype)
    x, y = init.normal((cfg.batch, cfg.d_in)), init.randint((cfg.batch,), cfg.n_classes)
    batch = {"x": x, "y": y}
    params = init.run(model.init, jax.random.PRNGKey(0), batch["x"])
    opt_state = init.run(tx.init, params)
    dims = f"B={cfg.batch} D={cfg.d_in} F={cfg.hidden} depth={cfg.depth} C={cfg.n_classes}"
    bounds = {"y": cfg.n_classes}
    if train:
        fn, args, argnums = bind(step, model=model, tx=tx), (params, opt_state, batch), (0, 1)
        desc = f"Flax MLP, optax AdamW step, {dims}"
        return Workload("flax", desc, fn, args, argnums, cfg, bounds)
    fn, args = bind(forward, model=model), (params, batch["x"])
    return Workload("flax", f"Flax MLP, forward, {dims}", fn, args, (0,), cfg, bounds)
