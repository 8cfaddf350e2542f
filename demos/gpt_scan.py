"""The GPT of `demos/gpt.py` with its blocks stacked on a leading layer dim and run by `lax.scan`.

This is how large models are usually written (one traced block, fast compiles), and it gives
the explorer a `scan` whose carried activation and per-layer weight slices must agree on
sharding across iterations. `stack_blocks` maps unrolled params to this layout, and the two
models compute the same loss for the same weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from demos import gpt
from demos.adam import adam_update
from demos.gpt import SIZES, GPTConfig
from demos.workload import Init, Workload, resolve_config


def stack_blocks(params: dict) -> dict:
    """Unrolled GPT params -> blocks stacked leaf-wise, e.g. blocks.attn.wq [L, D, D]."""
    return {**params, "blocks": jax.tree.map(lambda *xs: jnp.stack(xs), *params["blocks"])}


def init_params(init: Init, cfg: GPTConfig) -> dict:
    """Exactly gpt.init_params, stacked, so both layouts start from the same weights."""
    return init.run(stack_blocks, gpt.init_params(init, cfg))


def forward(params: dict, tokens: jax.Array, *, cfg: GPTConfig) -> jax.Array:
    """Logits [B, S, V] for int tokens [B, S]; one scan iteration per layer."""

    def layer(x, block_params):
        return gpt.block(block_params, x, cfg), None

    x, _ = jax.lax.scan(layer, gpt.embed(params, tokens), params["blocks"])
    return gpt.unembed(params, x)


def loss_fn(params: dict, batch: dict, *, cfg: GPTConfig) -> jax.Array:
    return gpt.cross_entropy(forward(params, batch["tokens"], cfg=cfg), batch["targets"])


def train_step(params: dict, opt_state: dict, batch: dict, *, cfg: GPTConfig):
    """One Adam step: returns (new_params, new_opt_state, loss)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, cfg=cfg)
    params, opt_state = adam_update(params, grads, opt_state, lr=cfg.lr)
    return params, opt_state, loss


def make_gpt_scan(size: str = "tiny", train: bool = True, **overrides) -> Workload:
    """Scan-over-layers GPT as a Workload; same signatures as `make_gpt`."""
    cfg = resolve_config("make_gpt_scan", SIZES, size, overrides)
    title, name = "GPT decoder, scan over layers", "gpt-scan"
    return gpt.decoder_workload(name, title, cfg, size, init_params, forward, train_step, train)
