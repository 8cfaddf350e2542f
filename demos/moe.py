"""Mixture-of-experts decoder (Mixtral-like): Llama blocks whose MLP is top-k routed experts.

Routing is GShard/Switch style with a fixed expert capacity C: each sequence is a group, each
token picks its top-k experts, and one-hot `dispatch` / `combine` tensors [B, S, E, C] move
tokens into per-expert buffers [B, E, C, D] with einsums and back. So the expert dim E is a real
tensor dim shared by the router, the buffers and the expert weights [E, D, F], and expert
parallelism is an ordinary sharding of E (the einsums become all-to-alls). Tokens past an
expert's capacity are dropped (their residual passes through), as in Switch Transformer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from demos.adam import adam_update
from demos.gpt import cross_entropy, decoder_workload
from demos.llama import attention, check_heads, gqa_params, rms_norm
from demos.workload import Init, Workload, resolve_config


@dataclass(frozen=True)
class MoEConfig:
    vocab: int = 256  # V
    seq: int = 32  # S, also the routing group size
    d_model: int = 64  # D
    n_heads: int = 4  # H
    n_kv_heads: int = 2  # KV (grouped-query attention, as in Llama)
    n_layers: int = 2  # L
    d_ff: int = 128  # F, per-expert SwiGLU hidden width
    n_experts: int = 8  # E
    top_k: int = 2  # experts per token
    capacity_factor: float = 1.25  # buffer slack over a perfectly balanced load
    batch: int = 8  # B, number of routing groups
    aux_loss_weight: float = 0.01  # Switch load-balancing loss coefficient
    rope_base: float = 10000.0
    lr: float = 3e-4
    dtype: str = "float32"

    def __post_init__(self):
        check_heads(self)
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(
                f"MoEConfig: expected 1 <= top_k <= n_experts, "
                f"got top_k={self.top_k}, n_experts={self.n_experts}"
            )

    @property
    def capacity(self) -> int:
        """C: slots per expert per group, k*S*factor/E rounded up to a multiple of 8 to shard."""
        return 8 * math.ceil(self.top_k * self.seq * self.capacity_factor / self.n_experts / 8)


SIZES = {
    "tiny": MoEConfig(),
    "mixtral-8x7b": MoEConfig(
        vocab=32000,
        seq=4096,
        d_model=4096,
        n_heads=32,
        n_kv_heads=8,
        n_layers=32,
        d_ff=14336,
        n_experts=8,
        top_k=2,
        batch=8,
        rope_base=1e6,
        dtype="bfloat16",
    ),
}


def init_params(init: Init, cfg: MoEConfig) -> dict:
    """N(0, 0.02) weights; expert weights carry the leading expert dim E."""
    D, F, E = cfg.d_model, cfg.d_ff, cfg.n_experts
    kv_dim = cfg.n_kv_heads * (D // cfg.n_heads)

    def block():
        shapes = {"router": (D, E), "w_gate": (E, D, F), "w_up": (E, D, F), "w_down": (E, F, D)}
        return {
            "attn_norm": init.ones((D,)),
            "attn": gqa_params(init, D, kv_dim),
            "moe_norm": init.ones((D,)),
            "moe": {w: init.normal(shape, 0.02) for w, shape in shapes.items()},
        }

    return {
        "embed": init.normal((cfg.vocab, D), 0.02),
        "blocks": [block() for _ in range(cfg.n_layers)],
        "norm": init.ones((D,)),
        "lm_head": init.normal((D, cfg.vocab), 0.02),
    }


def route(router_logits: jax.Array, cfg: MoEConfig) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Top-k routing with capacity: (dispatch, combine) [B, S, E, C] and the balance loss.

    Slots are handed out first-choice-first: all tokens' 1st choices queue before any 2nd
    choice, so overflow drops the less preferred assignments.
    """
    B, S, E = router_logits.shape
    k, C = cfg.top_k, cfg.capacity
    probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
    gate, expert = jax.lax.top_k(probs, k)  # [B, S, k]
    gate = gate / gate.sum(-1, keepdims=True)  # renormalise over the chosen k (Mixtral)
    chosen = jax.nn.one_hot(expert, E).transpose(0, 2, 1, 3).reshape(B, k * S, E)
    slot = jnp.cumsum(chosen, axis=1) - 1  # queue position in each expert's buffer
    # one_hot of an out-of-range slot (>= C) is all zeros: that is where tokens get dropped.
    slots = (jax.nn.one_hot(slot, C) * chosen[..., None]).reshape(B, k, S, E, C)
    dispatch = slots.sum(1)
    combine = jnp.einsum("bksec,bsk->bsec", slots, gate)
    # Switch loss: E * sum_e (fraction of first choices to e) * (mean router prob of e).
    balance = E * jnp.sum(chosen[:, :S].mean((0, 1)) * probs.mean((0, 1)))
    return dispatch, combine, balance


def moe_mlp(p: dict, x: jax.Array, cfg: MoEConfig) -> tuple[jax.Array, jax.Array]:
    """Routed SwiGLU experts, [B, S, D] -> [B, S, D], plus the balance loss."""
    dispatch, combine, balance = route(x @ p["router"], cfg)
    xe = jnp.einsum("bsec,bsd->becd", dispatch.astype(x.dtype), x)  # [B, E, C, D]
    h = jax.nn.silu(jnp.einsum("becd,edf->becf", xe, p["w_gate"]))
    h = h * jnp.einsum("becd,edf->becf", xe, p["w_up"])
    ye = jnp.einsum("becf,efd->becd", h, p["w_down"])
    return jnp.einsum("bsec,becd->bsd", combine.astype(x.dtype), ye), balance


def forward_with_aux(params: dict, tokens: jax.Array, cfg: MoEConfig):
    """(logits [B, S, V], summed balance loss) for int tokens [B, S]."""
    x, aux = jnp.take(params["embed"], tokens, axis=0), 0.0
    for p in params["blocks"]:
        x = x + attention(p["attn"], rms_norm(p["attn_norm"], x), cfg)
        y, balance = moe_mlp(p["moe"], rms_norm(p["moe_norm"], x), cfg)
        x, aux = x + y, aux + balance
    return rms_norm(params["norm"], x) @ params["lm_head"], aux


def forward(params: dict, tokens: jax.Array, *, cfg: MoEConfig) -> jax.Array:
    """Logits [B, S, V] for int tokens [B, S]."""
    return forward_with_aux(params, tokens, cfg)[0]


def loss_fn(params: dict, batch: dict, *, cfg: MoEConfig) -> jax.Array:
    logits, aux = forward_with_aux(params, batch["tokens"], cfg)
    return cross_entropy(logits, batch["targets"]) + cfg.aux_loss_weight * aux


def train_step(params: dict, opt_state: dict, batch: dict, *, cfg: MoEConfig):
    """One Adam step: returns (new_params, new_opt_state, loss)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, cfg=cfg)
    params, opt_state = adam_update(params, grads, opt_state, lr=cfg.lr)
    return params, opt_state, loss


def make_moe(size: str = "tiny", train: bool = True, **overrides) -> Workload:
    """MoE decoder as a Workload: `train_step(params, opt_state, batch)` or `forward`."""
    cfg = resolve_config("make_moe", SIZES, size, overrides)
    title = f"MoE decoder, top-{cfg.top_k} of E={cfg.n_experts}, capacity {cfg.capacity}"
    return decoder_workload("moe", title, cfg, size, init_params, forward, train_step, train)
