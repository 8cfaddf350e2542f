"""Two-layer MLP, `relu(x @ w1) @ w2`: the smallest program with a real sharding choice.

No biases, so exactly four named dims arise: batch B, input D, hidden F and output O. The
classic Megatron split (w1 on F by columns, w2 on F by rows) and plain data parallelism over B
are both visible here.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from demos.workload import Init, Workload, bind, resolve_config


@dataclass(frozen=True)
class MLPConfig:
    batch: int = 16  # B
    d_in: int = 64  # D
    hidden: int = 128  # F
    d_out: int = 32  # O
    lr: float = 1e-2  # SGD step size
    dtype: str = "float32"


SIZES = {
    "tiny": MLPConfig(),
    "large": MLPConfig(batch=1024, d_in=8192, hidden=32768, d_out=8192, dtype="bfloat16"),
}


def init_params(init: Init, cfg: MLPConfig) -> dict:
    """Weights w1 [D, F], w2 [F, O], scaled by fan-in so activations start O(1)."""
    return {
        "w1": init.normal((cfg.d_in, cfg.hidden), cfg.d_in**-0.5),
        "w2": init.normal((cfg.hidden, cfg.d_out), cfg.hidden**-0.5),
    }


def make_batch(init: Init, cfg: MLPConfig) -> dict:
    """Random regression batch: x [B, D], y [B, O]."""
    return {"x": init.normal((cfg.batch, cfg.d_in)), "y": init.normal((cfg.batch, cfg.d_out))}


def forward(params: dict, x: jax.Array) -> jax.Array:
    """[B, D] -> [B, O]."""
    return jax.nn.relu(x @ params["w1"]) @ params["w2"]


def loss_fn(params: dict, batch: dict) -> jax.Array:
    """Mean squared error, in float32 so bf16 configs still reduce accurately."""
    err = forward(params, batch["x"]).astype(jnp.float32) - batch["y"]
    return jnp.mean(err**2)


def train_step(params: dict, batch: dict, *, lr: float) -> tuple[dict, jax.Array]:
    """One SGD step: returns (new_params, loss)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    new = jax.tree.map(lambda p, g: (p - lr * g).astype(p.dtype), params, grads)
    return new, loss


def make_mlp(size: str = "tiny", train: bool = False, **overrides) -> Workload:
    """The MLP as a Workload: SGD `train_step(params, batch)` or `forward(params, x)`."""
    cfg = resolve_config("make_mlp", SIZES, size, overrides)
    init = Init(abstract=size != "tiny", dtype=cfg.dtype)
    params, batch = init_params(init, cfg), make_batch(init, cfg)
    if train:
        fn, args, what = bind(train_step, lr=cfg.lr), (params, batch), "SGD train step"
    else:
        fn, args, what = forward, (params, batch["x"]), "forward"
    desc = f"2-layer MLP relu(x@w1)@w2, {what}, B={cfg.batch} D={cfg.d_in} F={cfg.hidden}"
    return Workload("mlp", desc, fn, args, (0,), cfg)
